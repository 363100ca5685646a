"""What a worker's memory grows by while it reads remote shards interleaved: about ``read_window``,
not two or three times it (request buffers grown by appending, then every span copied out of them,
then parsed from the copies). Measured (peak resident memory of the DALI worker processes), not
timed."""

import os

import pytest

from dali_shards import pipeline_info, sharded_pipeline
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import write_manifest
from dali_shards.testing.pipelines import run_epochs
from dali_shards.testing.servers import HTTPShardServer
from dali_shards.tools.writer import ShardWriter

pytest.importorskip("aiohttp")
MB = 1 << 20


@pytest.fixture(scope="module")
def big_dir(tmp_path_factory):
    """24 shards of 24 random samples of 128-640 KB (about 220 MB): each of two workers reads
    about 110 MB an epoch, more than the window measured."""
    import numpy as np

    d = tmp_path_factory.mktemp("remote-memory")
    rng = np.random.default_rng(11)
    with ShardWriter(str(d / "mem-%02d.tar"), max_count=24) as w:
        for i in range(24 * 24):
            w.write({"__key__": f"{i:06d}", "bin": rng.bytes(int(rng.integers(128 << 10, 640 << 10)))})
    write_manifest(str(d / "manifest.json"), scan_shards(w.paths))
    return d


def rss(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def children():
    """The processes this one started (the pipeline's workers among them)."""
    me, found = os.getpid(), set()
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == me:
            found.add(int(name))
    return found


def growth(url, window):
    """The largest growth of a worker's peak resident memory over 2 shuffled epochs, from when the
    pipeline was built."""

    @sharded_pipeline(url, fields=("bin",), batch_size=8, py_num_workers=2, shuffle=True, read_window=window,
                      num_threads=1, device_id=None)  # fmt: skip
    def pipe(data):
        return data.shape()

    p = pipe()
    assert pipeline_info(p).plan(0).interleaving
    before = children()
    p.build()
    pids = children() - before
    assert len(pids) >= 2, "the workers run in processes of their own"
    start = {pid: rss(pid, "VmRSS") for pid in pids}
    run_epochs(p, 2)
    return max(rss(pid, "VmHWM") - start[pid] for pid in pids)


def test_a_workers_memory_grows_by_about_the_read_window(big_dir):
    """The fixed part (libraries, DALI's shared-memory batches, a sample being packed: what the
    same reading costs with a 1 MB window, about 25 MB here) is measured, then the window's share:
    it used to be 1.5-1.7 x ``read_window`` (+ 40 MB fixed), now within 1.2 x."""
    with HTTPShardServer(str(big_dir)) as http:
        url = f"{http.url}/manifest.json"
        fixed = growth(url, 1 * MB)
        windowed = growth(url, 64 * MB)
    share = windowed - fixed
    assert share > 32 * MB, ("the window was used", fixed / MB, windowed / MB)
    assert share <= 1.3 * 64 * MB, (
        f"{windowed / MB:.0f} MB, {fixed / MB:.0f} MB of it fixed: {share / (64 * MB):.2f} x the window"
    )
