"""One resume contract (``dali_shards.testing.resume.check_resume``) on every mode (contiguous runs,
interleaving, bucketing, streaming) and both transfers."""

import pytest

from dali_shards.testing.pipelines import identity_pipeline
from dali_shards.testing.resume import check_resume

COMMON = dict(batch_size=4, py_num_workers=2, shuffle=True, seed=5)


def with_length(sample):
    return {"index": sample["__index__"], "length": len(sample["jpg"])}


def pipeline(source, **kw):
    fields = ("jpg", "__index__") if "map" in kw else ("__index__",)
    return identity_pipeline(source, fields, outputs="index", **{**COMMON, **kw})


MODES = {
    "contiguous": (dict(world_size=2, shuffle_block=0, shuffle_buffer=5), True),
    "interleaved": (dict(world_size=2), True),
    "bucketed": (dict(world_size=2, map=with_length, bucket_by=lambda out: out["length"], bucket_window=16), True),
    # the streaming mode promises the step count only: its streams restart the epoch on resume
    "streaming": (dict(world_size=1, samples_per_epoch=24), False),
}


@pytest.fixture(scope="module")
def shards(make_shards):
    return make_shards((5,) * 9 + (2,))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_mode_resumes_where_it_stopped(shards, mode, transfer):
    options, exact = MODES[mode]
    factory = pipeline(shards, transfer=transfer, **options)
    if mode == "interleaved":
        assert factory().dali_shards.plan(0).interleaving
    # the merge transfer hands over the same plan: its resume at the points that differ for it (a cut
    # epoch, the next one), the ring's at every point
    stops = (0, 1, "mid", "end", "next") if transfer == "ring" else (1, "mid", "next")
    checked = check_resume(factory, ["index"], world=options["world_size"], exact=exact, stops=stops)
    assert checked["steps_per_epoch"] >= 3
