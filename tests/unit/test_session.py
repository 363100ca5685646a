"""The run session without a framework or DALI: it imports neither (checked with both blocked), and
driven through its two interfaces -- a ``Feed`` that hands over each step's ``__index__`` and
status as the plan says a pipeline's outputs hold them, and ``Ranks`` -- it delivers every sample
once an epoch over the ranks, masks the padding, counts ``len()``, resumes from a state (also under
another layout), audits, and checks that the ranks planned the same epoch. (The unit tier fails if
anything imported DALI or torch: the session's run needs neither.)"""

import os
import subprocess
import sys

import numpy as np
import pytest

from dali_shards.errors import ConfigError
from dali_shards.options import ShardedOptions
from dali_shards.session import STATUS_OUTPUT, RunSession
from dali_shards.setup.info import ShardedPipelineInfo
from dali_shards.setup.resolve import resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Transfer:
    """A transfer whose workers never fail (``info.transfer``: what a session asks of one)."""

    def watch(self):
        pass

    def pids(self):
        return []

    def dead(self):
        return []

    def kill(self):
        pass

    def translate(self, exc):
        return None

    def lost_worker(self, exc):
        return False

    def in_flight(self, pipeline):
        return 0


class Pipeline:
    """What a session touches of DALI's ``Pipeline``."""

    device_id = None

    def __init__(self, info):
        self.dali_shards, self._built, self.outputs = info, False, None

    def set_outputs(self, *outputs):
        self.outputs = outputs

    def build(self):
        self._built = True


def make(paths, **kw):
    """A pipeline of ``paths``; ``rebuild(resume_from=...)`` makes it again from a state."""
    keywords = dict(source=paths, fields=("cls",), batch_size=4, py_num_workers=2, seed=3, shuffle=True, **kw)
    info = ShardedPipelineInfo(
        resolved=resolve(ShardedOptions.from_keywords(**keywords)),
        rebuild=lambda **more: make(paths, **{**kw, **more}),
        outputs=("cls",),
        slot_status="status",
        transfer=Transfer(),
    )
    return Pipeline(info)


class Feed:
    """Each step's ``__index__`` (the batch) and status rows as the plan says a pipeline delivers
    them, epoch after epoch."""

    def open(self, pipeline, names, keys, varying):
        assert list(names) == ["cls", STATUS_OUTPUT] and pipeline.outputs == ("cls", "status") and pipeline._built
        self.info = pipeline.dali_shards
        self.epoch = self.info.start_epoch
        self.step = self.info.plan(self.epoch).start_step

    def next(self):
        plan = self.info.plan(self.epoch)
        if self.step >= plan.steps:
            raise StopIteration
        index, valid = (a[self.step] for a in plan.rank_batches(self.info.rank))
        self.step += 1
        return {"index": index}, np.stack([index, valid.astype(np.int64)], axis=1)

    def reset(self):
        self.epoch += 1
        self.step = self.info.plan(self.epoch).start_step

    def close(self):
        self.info = None

    def fetched_ahead(self):
        return False


def delivered(session, steps=None):
    """The valid ``__index__`` of the session's batches: the rest of the epoch (or ``steps`` batches)."""
    session.loop()
    out = []
    while steps is None or steps > 0:
        try:
            batch, mask = session.next()
        except StopIteration:
            break
        out += batch["index"][mask].tolist()
        steps = None if steps is None else steps - 1
    return out


@pytest.fixture(scope="module")
def paths(make_shards):
    return make_shards((5, 0, 7, 3))


def test_the_session_imports_neither_a_framework_nor_dali():
    blocked = ("torch", "jax", "tensorflow", "paddle", "nvidia", "nvidia.dali")
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r}));"
        "import dali_shards.session, dali_shards.session.run, dali_shards.session.guard, dali_shards.session.audit;"
        "import dali_shards.session.incidents, dali_shards.session.plancheck; print('imported')"
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr


def test_two_ranks_get_every_sample_once_an_epoch_padding_masked_and_audited(paths):
    sessions = [RunSession(make(paths, world_size=2, rank=r), ["cls"], Feed(), audit=True) for r in range(2)]
    steps = sessions[0].info.steps_per_epoch
    assert steps == 2  # 15 samples in batches of 4 on 2 ranks: the last step padded
    for epoch in range(3):
        seen = []
        for s in sessions:
            assert (s.epoch, s.step, len(s)) == (epoch, 0, steps)
            seen += delivered(s)
        assert sorted(seen) == list(range(15)), f"epoch {epoch}"
    assert [a["exactly_once"] for s in sessions for a in s.audits] == [True] * 6
    assert [sum(s.audits[e]["delivered"] for s in sessions) for e in range(3)] == [15] * 3  # padding not counted


def test_a_state_mid_epoch_is_resumed_by_a_rebuild_and_under_another_layout(paths):
    two = [RunSession(make(paths, world_size=2, rank=r), ["cls"], Feed()) for r in range(2)]
    first = [i for s in two for i in delivered(s, steps=1)]
    states = [s.state_dict() for s in two]
    assert states[0] == states[1] and states[0]["epoch"] == 0
    same = RunSession(make(paths, world_size=2, rank=0), ["cls"], Feed())
    same.load_state_dict(states[0])  # the pipeline rebuilt from the state, the same layout
    assert (same.epoch, same.step, len(same)) == (0, 1, 1)
    alone = RunSession(make(paths), ["cls"], Feed(), audit=True)
    alone.load_state_dict(states[0])  # one rank now: the rest of the epoch planned over it
    assert (alone.epoch, alone.step) == (0, 1)
    rest = delivered(alone)
    assert sorted(first + rest) == list(range(15))
    assert alone.audits[0]["exactly_once"] and alone.audits[0]["plan_missing"] == 0
    assert sorted(delivered(alone)) == list(range(15)) and alone.epoch == 2  # the next epoch: whole


def test_reset_leaves_an_epoch_and_the_next_is_whole(paths):
    s = RunSession(make(paths), ["cls"], Feed(), audit=True)
    assert len(s) == 4 and len(delivered(s, steps=1)) == 4
    s.reset()
    assert (s.epoch, s.step) == (1, 0) and s.audits == []  # an epoch left early is not audited
    assert sorted(delivered(s)) == list(range(15)) and [a["epoch"] for a in s.audits] == [1]


class Ranks:
    """Two ranks: this one and another whose plan summary is ``other(this rank's)``."""

    def __init__(self, other):
        self.other = other

    def size(self):
        return 2

    def gather_ints(self, values, device_id):
        return [values, self.other(list(values))]

    def gather_objects(self, value):
        return [value, value]


@pytest.mark.parametrize(
    "other, problem",
    [
        (lambda v: [v[0], 1, *v[2:]], None),
        (lambda v: [v[0] + 1, 1, *v[2:]], "the ranks planned different epochs"),
        (lambda v: v, r"the pipelines' ranks are \[0, 0\]"),
    ],
)
def test_the_first_batch_waits_for_every_rank_to_have_planned_the_same_epoch(paths, other, problem):
    s = RunSession(make(paths, world_size=2, rank=0), ["cls"], Feed(), Ranks(other))
    if problem is None:
        assert len(delivered(s, steps=1)) == 4
    else:
        with pytest.raises(ConfigError, match=problem):
            s.next()


def test_a_pipeline_feeds_one_session_and_output_names_are_checked(paths):
    pipe = make(paths)
    RunSession(pipe, ["cls"], Feed())
    with pytest.raises(ConfigError, match="already feeds"):
        RunSession(pipe, ["cls"], Feed())
    with pytest.raises(ConfigError, match="output_map has 2 names"):
        RunSession(make(paths), ["cls", "more"], Feed())
