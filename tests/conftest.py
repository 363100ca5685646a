"""Fixtures shared by every tier, and the tiers' markers: a test's folder (unit/, pipeline/,
integration/) is its marker, so ``pytest -m "not integration"`` or ``pytest tests/unit`` pick a
tier. A run of only unit tests fails if anything imported DALI or torch: that tier must stay pure."""

import os
import sys

import pytest

from dali_shards.sample_data import DEFAULT_SHARD_SIZES
from dali_shards.testing.shards import write_shards

DATA = os.path.join(os.path.dirname(__file__), "data")

# On a GPU machine the tests' own process sees no GPU: the tiers test CPU pipelines, and one of
# them touching CUDA (torch probing the device, say) would make DALI refuse every later 'fork'
# start in this process. The GPU tests (tests/pipeline/test_gpu.py) run their ranks in processes
# of their own, with the devices this run was given (GPU_DEVICES; None: all of them).
if "DALI_SHARDS_TEST_GPUS" not in os.environ:
    from dali_shards.device import gpu_available

    os.environ["DALI_SHARDS_TEST_GPUS"] = os.environ.get("CUDA_VISIBLE_DEVICES", "all") if gpu_available() else ""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
GPU_DEVICES = os.environ["DALI_SHARDS_TEST_GPUS"]
TIERS = ("unit", "pipeline", "integration")


@pytest.fixture(scope="session")
def mnist_shard():
    """A third-party WebDataset shard (gzipped tar) from WebDataset's test data."""
    return os.path.join(DATA, "wds-sample-mnist.tgz")


@pytest.fixture(scope="session")
def photo_shards(tmp_path_factory):
    """The 47 built-in photos in 5 shards of uneven sizes, one of them empty."""
    out = tmp_path_factory.mktemp("photos")
    paths = write_shards(out, DEFAULT_SHARD_SIZES)
    return {
        "paths": paths,
        "pattern": os.path.join(str(out), "sample-{000000..000004}.tar"),
        "total": sum(DEFAULT_SHARD_SIZES),
    }


@pytest.fixture(scope="session")
def make_shards(tmp_path_factory):
    """A factory of test shards: ``make_shards(sizes, sample=None, *, folder=None, prefix="sample",
    name=None, manifest=False)`` writes ``dali_shards.testing.shards.write_shards`` into ``folder``
    (by default a new temporary folder) and returns the paths. Session-scoped, so that fixtures of
    any scope use it; a test that changes the shards it gets makes its own (``folder=tmp_path``)."""

    def make(sizes, sample=None, *, folder=None, **kw):
        if folder is None:
            folder = tmp_path_factory.mktemp(kw.get("prefix", "shards"))
        return write_shards(folder, sizes, sample, **kw)

    return make


def _tier(item) -> str:
    parts = os.path.relpath(str(item.path), os.path.dirname(__file__)).split(os.sep)
    return parts[0] if parts[0] in TIERS else "unit"


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(getattr(pytest.mark, _tier(item)))
    config._dali_shards_unit_only = bool(items) and all(_tier(i) == "unit" for i in items)


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config, "_dali_shards_unit_only", False):
        heavy = [m for m in ("nvidia.dali", "torch") if m in sys.modules]
        if heavy:
            print(
                f"\nERROR: a unit test imported {heavy}; unit tests must need neither DALI nor torch", file=sys.stderr
            )
            session.exitstatus = 1


@pytest.fixture(params=("ring", "merge"))
def transfer(request):
    """Each transfer: tests of the core contract (exactly once, resume, faults) take this fixture,
    so that they run on both; every other test runs on the default (``"ring"``)."""
    return request.param
