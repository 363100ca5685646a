"""No stall when an epoch turns (issue 47): a worker prepares its next epoch while the epoch before
is read, at a step of its own (``worker/stagger.py``) -- its plan and order, and on the ring's fast
path the group of steps that opens it, read ahead -- and begins its groups at steps of its own, so
that a rank's workers never all read at the same step (before, every worker planned and read a
whole group at the turn). Counted by the reads each worker makes at each step, never by time; what
the workers hand on is the same, step for step, as an epoch made when it is asked for."""

import itertools
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_shards.errors import ShardAccessError
from dali_shards.io.positioned import LocalFiles
from dali_shards.options import ShardedOptions
from dali_shards.setup.resolve import resolve
from dali_shards.ipc.tables import as_table
from dali_shards.transfer.ring.assemble import assemble
from dali_shards.transfer.ring.consumer import MiniBatch
from dali_shards.worker import grouped, stagger
from dali_shards.worker.direct import DirectBatches
from dali_shards.worker.planned import EpochBatches
from dali_shards.worker.sources import make_source

WORKERS, BATCH = 4, 8  # mini-batches of 2 samples; 60 samples: 8 steps per epoch


@given(workers=st.integers(1, 64), steps=st.lists(st.integers(1, 120), min_size=1, max_size=4),
       group=st.integers(1, 300))  # fmt: skip
@settings(max_examples=200, deadline=None)
def test_the_workers_spread_their_turns_and_groups_over_the_epochs(workers, steps, group):
    """Epochs of ``steps`` steps in turn: each worker's groups follow one another across epochs (the
    last of an epoch read with the next epoch's opening, at most a group's steps together); where
    the epochs are alike, no step has more workers beginning a group than the spread allows."""
    prepare = [stagger.prepare_step(w, workers, steps[0]) for w in range(workers)]
    assert all(0 <= p < steps[0] for p in prepare)
    assert max(Counter(prepare).values()) <= -(-workers // steps[0]), "at most ceil(W / S) workers prepare at a step"
    phases = [stagger.first_phase(w, workers, steps[0], group) for w in range(workers)]
    for e, count in enumerate(steps):
        g = min(group, count)
        starts: Counter = Counter()
        for w in range(workers):
            phase, first, last = phases[w], phases[w], None
            assert 0 <= phase < g
            while first < count:
                starts[first] += 1
                last, first = first, stagger.group_end(first, phase, group, count)
                assert last < first <= min(count, last + g), "a group holds at most g steps"
            assert last == stagger.last_start(phase, group, count) >= phase, "the next is read after the opening"
            reach = stagger.carried(phase, group, count)
            assert (count - last) + reach == g, "the last group and the steps it reaches into: one group"
            if e + 1 < len(steps):
                phases[w] = stagger.next_phase(reach, group, steps[e + 1])
                assert phases[w] <= reach, "the next epoch's opening: steps the last group reaches into"
        if len(set(steps[: e + 1])) == 1:  # epochs alike so far: the phases stay spread
            assert max(starts.values()) <= -(-workers // g), "groups begin at every step alike"


@pytest.fixture(scope="module")
def paths(make_shards):
    return make_shards([6] * 10)


def rank(paths, **kw):
    opts = dict(fields=("jpg", "cls", "__key__", "__index__", "__valid__"), batch_size=BATCH, py_num_workers=WORKERS,
                shuffle=True, seed=3, transfer="ring")  # fmt: skip
    opts.update(kw)
    return resolve(ShardedOptions.from_keywords(source=paths, **opts)).workers


class Rank:
    """A rank's workers run in lock step, as the ring's main process takes their steps: each step
    of each worker made and written as a slot would take it, the reads each makes counted by
    (epoch, step, worker) in ``reads``."""

    def __init__(self, configs, monkeypatch, direct=True, prepared=True):
        self.configs, self.direct, self.prepared = configs, direct, prepared
        self.sources = [make_source(c, direct=direct) for c in configs]
        self.now = (0, 0, 0)
        self.reads = defaultdict(int)
        self.made = {}  # each epoch's iterators, by worker
        read_runs, read = LocalFiles.read_runs, LocalFiles.read

        def counted(original):
            def wrapper(*args, **kw):
                self.reads[self.now] += 1
                return original(*args, **kw)

            return wrapper

        monkeypatch.setattr(LocalFiles, "read_runs", counted(read_runs))
        monkeypatch.setattr(LocalFiles, "read", counted(read))

    def epoch(self, epoch):
        """The epoch's steps, each the workers' fields assembled as the ring's consumer does."""
        if not self.prepared:  # a new source for every epoch: nothing prepared ahead
            self.sources = [make_source(c, direct=self.direct) for c in self.configs]
        batches = self.made[epoch] = [s.epoch(epoch) for s in self.sources]
        out, buf = [], np.zeros(8 << 20, dtype=np.uint8)
        for step in itertools.count():
            fields = []
            for w, it in enumerate(batches):
                self.now = (epoch, step, w)
                batch = next(it, None)
                if batch is None:
                    return out
                table = as_table(self.configs[w].packing, batch)
                used = table.write(buf)
                rows = buf[: len(table) * self.configs[w].packing.header_bytes].view(np.int64).reshape(len(table), -1)
                mini = MiniBatch(epoch, step, 0, rows.copy(), buf[:used].copy())
                fields.append([[bytes(np.asarray(x)) for x in f] if isinstance(f, list) else np.asarray(f).tolist()
                               for f in assemble(self.configs[w].packing, [mini])])  # fmt: skip
            out.append(fields)
        return out

    def readers(self, epoch, step):
        """The workers that read anything at ``step`` of ``epoch``."""
        return {w for (e, s, w), n in self.reads.items() if (e, s) == (epoch, step) and n}


def test_the_next_epoch_is_read_ahead_at_each_workers_own_step(paths, monkeypatch):
    """Steps of 2 samples in groups of 3 steps: 4 workers, their groups spread over the epoch. At
    the turn only the workers whose groups begin there read; every other worker's opening steps
    were read with its last group of the epoch before, at its own step; no step has more readers
    than the spread allows, where before all 4 read at every epoch's first step."""
    monkeypatch.setattr(grouped, "GROUP_SAMPLES", 6)
    ahead = Rank(rank(paths), monkeypatch)
    for epoch in range(4):
        assert ahead.epoch(epoch)
    for epoch in (1, 2, 3):
        made, before = ahead.made[epoch], ahead.made[epoch - 1]
        assert all(isinstance(b, DirectBatches) for b in made + before)
        phases = [b.phase for b in made]
        assert len(set(phases)) > 1, "the workers' groups begin at different steps"
        turn = ahead.readers(epoch, 0)
        assert turn == {w for w, p in enumerate(phases) if p == 0}, "at the turn, only the workers whose group begins"
        for w, b in enumerate(made):
            assert all(w not in ahead.readers(epoch, s) for s in range(b.phase)), "the opening steps were read ahead"
            assert w in ahead.readers(epoch - 1, before[w].prepare_at), "with the last group of the epoch before"
        assert max(len(ahead.readers(epoch, s)) for s in range(8)) <= 2, "4 workers, 3 steps a group: 2 at most"


@pytest.mark.parametrize("direct", [True, False])
def test_a_prepared_epoch_hands_on_what_an_epoch_made_at_its_turn_does(paths, monkeypatch, direct):
    """The fast path (groups read ahead) and the general way (the plan made ahead: the merge
    transfer's workers and every pipeline with a map): the same steps, sample for sample, padding
    included (60 samples in steps of 8: the last padded), as sources that prepare nothing."""
    monkeypatch.setattr(grouped, "GROUP_SAMPLES", 6)
    configs = rank(paths)
    ahead, fresh = Rank(configs, monkeypatch, direct=direct), Rank(configs, monkeypatch, direct=direct, prepared=False)
    shared = 0  # opening groups read after the last group, in its buffer
    for epoch in range(4):
        assert ahead.epoch(epoch) == fresh.epoch(epoch)
        kind = DirectBatches if direct else EpochBatches
        assert all(isinstance(s.prepared, kind) and s.prepared.epoch == epoch + 1 for s in ahead.sources)
        openings = [(s.prepared.opening, s.buffers) for s in ahead.sources if direct and s.prepared.opening is not None]
        shared += sum(np.shares_memory(o.buf, b.buffer) for o, b in openings if o.ok)
    assert shared or not direct
    if not direct:
        assert all(s.prepared._planned is not None and s.prepared._clock is None for s in ahead.sources), (
            "planned ahead, nothing read"
        )


def test_a_failed_preparation_leaves_the_epoch_to_its_turn(paths, monkeypatch):
    """Preparing is only a head start: an error there (a shard that cannot be read) is not raised
    ahead of its epoch; the epoch is made when it is asked for, and hands on the same steps."""
    monkeypatch.setattr(grouped, "GROUP_SAMPLES", 6)

    def fails(self):
        raise ShardAccessError(self.source.config.urls[0], "read error: injected")

    configs = rank(paths)
    expected = Rank(configs, monkeypatch, prepared=False).epoch(1)
    monkeypatch.setattr(DirectBatches, "prepare", fails)
    ahead = Rank(configs, monkeypatch)
    ahead.epoch(0)
    assert all(s.prepared is None for s in ahead.sources)
    assert ahead.epoch(1) == expected


def test_the_opening_group_shares_the_buffer_of_the_last_group(monkeypatch):
    """A worker's groups take one buffer: the next epoch's opening group, read with the current
    epoch's last group, goes after it where there is room; else into a spare, and the buffer grows
    to hold both when the next group is made, the spare let go. Memory for groups: one group's
    steps (the last group and the opening together are one group's), not two buffers."""
    monkeypatch.setattr(grouped, "GROUP_BYTES", 8_000)  # (room reserved at first: a group of GROUP_BYTES or more)
    buffers = grouped.GroupBuffers()
    first = buffers.get(10_000)
    opening = buffers.get(6_000, ahead=True)  # no room after the group: a spare
    assert not np.shares_memory(first, opening) and buffers.spare is opening
    again = buffers.get(10_000)  # the next group (the opening handed on by now): room for both
    assert buffers.spare is None and len(again) >= 10_240 + 6_000
    opening = buffers.get(6_000, ahead=True)
    assert np.shares_memory(again, opening) and buffers.spare is None
    assert opening.__array_interface__["data"][0] - again.__array_interface__["data"][0] == 10_240  # after the group, block-aligned
    assert len(buffers.get(4_000)) == len(again), "no new buffer while it is large enough"
