"""Memory: workers stream (their peak memory follows the shuffle buffer, not the shard), and samples
of very different sizes (1 KB to 5 MB) travel through shared memory intact."""

import hashlib
import os

import numpy as np

from dali_shards import sharded_pipeline
from dali_shards.testing.pipelines import worker_peak_rss
from dali_shards.tools.writer import ShardWriter


def write_random(path_pattern, sizes, seed, per_shard=10**6):
    rng = np.random.default_rng(seed)
    digests = {}
    with ShardWriter(path_pattern, max_count=per_shard) as w:
        for i, size in enumerate(sizes):
            data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            w.write({"__key__": f"{i:06d}", "bin": data})
            digests[i] = hashlib.sha1(data).hexdigest()
    return w.paths, digests


def peak_worker_rss(paths, shuffle_buffer=8, interleaving=False, **options):
    """The largest peak resident memory (VmHWM) of the pipeline's workers after one epoch, in MB."""

    @sharded_pipeline(
        paths,
        fields=("bin", "__index__"),
        batch_size=4,
        py_num_workers=2,
        shuffle=True,
        shuffle_buffer=shuffle_buffer,
        num_threads=1,
        device_id=None,
        **options,
    )
    def pipe(data, index):
        return data.shape(), index

    p = pipe()
    assert p.dali_shards.plan(0).interleaving == interleaving
    p.build()
    while True:
        try:
            p.run()
        except StopIteration:
            break
    return worker_peak_rss(p)


def test_worker_memory_follows_the_buffer_not_the_shard(tmp_path):
    small, _ = write_random(str(tmp_path / "small-%d.tar"), [1 << 20] * 10, seed=1)  # one 10 MB shard
    big, _ = write_random(str(tmp_path / "big-%d.tar"), [1 << 20] * 200, seed=2)  # one 200 MB shard
    assert os.path.getsize(big[0]) > 200 * 10**6
    small_peak = peak_worker_rss(small)
    big_peak = peak_worker_rss(big)
    # a worker holds at most its shuffle buffer (8 samples) and a batch: ~12 MB here; a worker that read
    # whole shards would need 190 MB more for the big one
    assert big_peak - small_peak < 48, (small_peak, big_peak)


def test_interleaved_worker_memory_does_not_grow_with_the_dataset(tmp_path):
    """Interleaving reads one sample at a time by its offsets: 16 shards of 1 MB or of 12 MB each
    (16 or 192 MB in all) cost a worker the same memory."""
    small, _ = write_random(str(tmp_path / "small-%d.tar"), [1 << 20] * 16, seed=1, per_shard=1)
    big, _ = write_random(str(tmp_path / "big-%d.tar"), [1 << 20] * 192, seed=2, per_shard=12)
    assert len(small) == len(big) == 16
    small_peak = peak_worker_rss(small, interleaving=True)
    big_peak = peak_worker_rss(big, interleaving=True)
    # a worker holds a batch's share and the sample being read (~4 MB here); one holding a piece of
    # every shard it reads would need ~90 MB more for the big set
    assert big_peak - small_peak < 24, (small_peak, big_peak)


def test_samples_from_1kb_to_5mb_in_one_dataset(tmp_path):
    rng = np.random.default_rng(7)
    sizes = [int(s) for s in rng.choice([1 << 10, 40 << 10, 700 << 10, 5 << 20], size=48, p=[0.4, 0.3, 0.2, 0.1])]
    sizes[5] = 5 << 20
    paths, digests = write_random(str(tmp_path / "mixed-%d.tar"), sizes, seed=3)

    @sharded_pipeline(
        paths, fields=("bin", "__index__"), batch_size=4, py_num_workers=2, shuffle=True, num_threads=1, device_id=None
    )
    def pipe(data, index):
        return data, index

    p = pipe()
    p.build()
    seen = {}
    while True:
        try:
            data, index = p.run()
        except StopIteration:
            break
        for k in range(len(index)):
            i = int(np.array(index[k]))
            seen[i] = hashlib.sha1(np.array(data[k]).tobytes()).hexdigest()
    assert seen == digests
