"""The write job's layout: which samples go into which shard, a pure function of (inputs, options,
seed) whatever the number of tasks; windows of blocks; the engines' and Parquet options' errors."""

import pytest

from dali_shards.engines.base import make_engine
from dali_shards.errors import ConfigError
from dali_shards.tools import layout
from dali_shards.tools.folderwriter import _split
from dali_shards.tools.imagefolder import SourceFile
from dali_shards.tools.parquet import parse_columns
from dali_shards.tools.raydata import cut


def test_file_shards_are_the_same_plan_for_the_same_seed_and_differ_for_another():
    files = [SourceFile(f"/d/{i}.jpg", i % 3, "jpg", size=1000 + i) for i in range(50)]
    plan = lambda seed: layout.file_shards(files, "o/%03d.tar", max_count=7, max_size=None, shuffle=True, seed=seed,  # noqa: E731
                                           keys=None, size_of=lambda f: f.size)  # fmt: skip
    a, b = plan(1), plan(1)
    assert [s.digest for s in a] == [s.digest for s in b] and [s.samples for s in a] == [7] * 7 + [1]
    assert sorted(src.path for s in a for _, src in s.files) == sorted(f.path for f in files)
    assert [s.digest for s in plan(2)] != [s.digest for s in a]


def test_windows_hold_whole_blocks_and_their_shards_cover_every_row_once():
    rows = [7, 0, 5, 9, 3, 12, 1]
    windows = layout.windows_of(list(range(len(rows))), rows, 10, shuffle=True, seed=3)
    assert sorted(b for w in windows for b in w.blocks) == [0, 2, 3, 4, 5, 6]  # the empty block left out
    assert all(w.samples >= 10 for w in windows[:-1]) and sum(w.samples for w in windows) == sum(rows)
    assert [w.first for w in windows] == [sum(v.samples for v in windows[:i]) for i in range(len(windows))]
    shards = layout.block_shards(windows, "o/%03d.tar", 4, "recipe")
    assert [s.number for s in shards] == list(range(len(shards)))
    for w in windows:
        mine = [(s.lo, s.hi) for s in shards if s.window is w]
        assert mine[0][0] == 0 and mine[-1][1] == w.samples and all(h - lo <= 4 for lo, h in mine)
        assert sorted(w.order(3, True)) == list(range(w.samples)) and w.order(3, True) == w.order(3, True)
    assert windows[0].order(3, False) == list(range(windows[0].samples))


def test_tasks_split_consecutive_groups_of_any_number():
    for n in (1, 2, 3, 7, 50):
        parts = _split(list(range(7)), n)
        assert [x for p in parts for x in p] == list(range(7)) and len(parts) == min(n, 7)


def test_a_ray_dataset_is_cut_into_blocks_of_fixed_rows_whatever_its_own_blocks():
    blocks = cut(["a", "b", "c"], [3, 0, 8], 4)
    assert [[(p.ref, p.lo, p.hi) for p in b] for b in blocks] == [
        [("a", 0, 3), ("c", 0, 1)], [("c", 1, 5)], [("c", 5, 8)]]  # fmt: skip


@pytest.mark.parametrize("text, message", [
    ("jpg", "each item is EXT=COLUMN"), ("jpg=a,JPG=b", "names extension 'JPG' twice"), ("__key__=k", "names no member"),
])  # fmt: skip
def test_malformed_columns_are_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_columns(text)


def test_engine_options_that_do_not_fit_are_refused():
    with pytest.raises(ConfigError, match="unknown engine 'spark'"):
        make_engine("spark")
    with pytest.raises(ConfigError, match="Ray address was given with engine 'local'"):
        make_engine("local", address="ray://x:10001")
    with pytest.raises(ConfigError, match="processes .* is for engine 'local'"):
        make_engine("ray", processes=2)
    with pytest.raises(ConfigError, match="processes must be at least 1, got 0"):
        make_engine("local", processes=0)
    with pytest.raises(ConfigError, match="needs a %-format"):
        layout.check_options("o/train.tar", 10, None)


class _StandInRay:
    """What RayEngine asks of Ray, in this process: tasks run when their result is asked for."""

    class exceptions:
        class RayTaskError(Exception):
            def __init__(self, cause):
                self.cause = cause

        WorkerCrashedError = NodeDiedError = ObjectLostError = type("Lost", (Exception,), {})

    def __init__(self, cpus):
        self.cpus, self.submitted, self.peak, self.cancelled = cpus, set(), 0, []

    def cluster_resources(self):
        return {"CPU": self.cpus}

    def remote(self, fn):
        ray = self

        class Remote:
            def options(self, **_):
                return self

            def remote(self, task):
                ref = (fn, task)
                ray.submitted.add(ref)
                ray.peak = max(ray.peak, len(ray.submitted))
                return ref

        return Remote()

    def wait(self, pending, num_returns):
        return pending[:num_returns], pending[num_returns:]

    def get(self, ref):
        self.submitted.discard(ref)
        try:
            return ref[0](ref[1])
        except ConfigError as exc:
            raise self.exceptions.RayTaskError(exc) from None

    def cancel(self, ref, force):
        self.cancelled.append(ref)


def _square(x):
    if x == 30:
        raise ConfigError("task 30 is bad")
    return x * x


def test_the_ray_engine_submits_a_few_tasks_per_cpu_and_cancels_the_rest_on_an_error():
    from dali_shards.engines.ray_engine import AHEAD, RayEngine

    engine = object.__new__(RayEngine)
    engine.ray, engine._started, engine._asked = _StandInRay(cpus=2), False, float("-inf")
    assert sorted(engine.run(_square, range(25))) == [(i, i * i) for i in range(25)]
    assert engine.ray.peak == AHEAD * 2  # never the whole job at once
    with pytest.raises(ConfigError, match="task 30 is bad"):  # the task's own error, as it was
        list(engine.run(_square, range(100)))
    assert len(engine.ray.cancelled) == AHEAD * 2 - 1 and engine.ray.peak == AHEAD * 2
