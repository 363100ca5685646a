"""One resume contract (``dali_shards.testing.resume.check_resume``) on every mode: contiguous runs,
interleaving, bucketing, streaming."""

import pytest

from dali_shards import sharded_pipeline
from dali_shards.sample_data import write_sample_shards
from dali_shards.testing.resume import check_resume

COMMON = dict(batch_size=4, py_num_workers=2, shuffle=True, seed=5, num_threads=1, device_id=None)


def with_length(sample):
    return {"index": sample["__index__"], "length": len(sample["jpg"])}


def pipeline(source, **kw):
    mapped = "map" in kw

    @sharded_pipeline(source, fields=("jpg", "__index__") if mapped else ("__index__",), **{**COMMON, **kw})
    def pipe(index):
        return index

    return pipe


MODES = {
    "contiguous": (dict(world_size=2, shuffle_block=0, shuffle_buffer=5), True),
    "interleaved": (dict(world_size=2), True),
    "bucketed": (dict(world_size=2, map=with_length, bucket_by=lambda out: out["length"], bucket_window=16), True),
    # the streaming mode promises the step count only: its streams restart the epoch on resume
    "streaming": (dict(world_size=1, samples_per_epoch=24), False),
}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_sample_shards(str(tmp_path_factory.mktemp("resume")), shard_sizes=(5,) * 9 + (2,))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_resumes_where_it_stopped(shards, mode):
    options, exact = MODES[mode]
    factory = pipeline(shards, **options)
    if mode == "interleaved":
        assert factory().dali_shards.plan(0).interleaving
    checked = check_resume(factory, ["index"], world=options["world_size"], exact=exact)
    assert checked["steps_per_epoch"] >= 3
