"""Fixtures of the integration tier."""

import shutil
import tempfile

import pytest


@pytest.fixture(scope="module")
def shard_dir(make_shards, request, tmp_path_factory):
    """A folder to serve: the photos in shards of the module's ``SIZES``, named as its ``PATTERN``
    (``"<prefix>-{000000..000011}.tar"``), and their manifest."""
    prefix = request.module.PATTERN.split("-{")[0]
    folder = tmp_path_factory.mktemp(prefix)
    make_shards(request.module.SIZES, prefix=prefix, manifest=True, folder=folder)
    return folder


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance of 2 CPUs for a module (its start costs seconds), its files in a
    temporary folder, its address; after the module, none of its processes or files are left."""
    ray = pytest.importorskip("ray")
    psutil = pytest.importorskip("psutil")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths live under it
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             _temp_dir=temp)  # fmt: skip
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]  # Ray's, workers too
        ray.shutdown()
        _, alive = psutil.wait_procs(started, timeout=30)
        for p in alive:
            p.kill()
        shutil.rmtree(temp, ignore_errors=True)
    assert not alive, f"Ray's processes outlived ray.shutdown(): {[p.pid for p in alive]}"
