"""Integer fields (``.cls``, ``.index``, ``.label``) through real pipelines, on both transfers: the
whole member is the value (surrounding whitespace, a sign and leading zeros allowed), or a
``ShardFormatError`` naming the shard, the sample and the field (a counted skip with
``on_error="skip"``). Mini-batches of 32 samples, so that the ring reads its steps by its fast
path (``worker/direct.py``); 2 workers with mini-batches of 4 for the general way."""

import pytest

from dali_shards import ShardFormatError, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.tools.writer import write_shard

SHARDS, PER_SHARD = 4, 24
BAD_KEY = "000030"  # in the second shard


def write(tmp_path, text_of):
    """Four shards; sample ``i``'s .label member is ``text_of(i)``."""
    paths = []
    for s in range(SHARDS):
        path = str(tmp_path / f"n-{s}.tar")
        first = s * PER_SHARD
        write_shard(path, [{"__key__": f"{i:06d}", "label": text_of(i)} for i in range(first, first + PER_SHARD)])
        paths.append(path)
    return paths


def labels(paths, transfer, on_error="raise", fast=True):
    """{__index__: delivered label} of one epoch, and its audit."""

    workers = 1 if fast else 2

    @sharded_pipeline(paths, fields=("label", "__index__"), batch_size=32 if fast else 8, py_num_workers=workers,
                      shuffle=True, seed=2, on_error=on_error, num_threads=1, device_id=None,
                      transfer=transfer)  # fmt: skip
    def pipe(label, index):
        return label, index

    it = DALIShardedIterator(pipe(), ["label", "index"], audit=True)
    got = {}
    for (b,) in it:
        for label, index in zip(b["label"].tolist(), b["index"].tolist()):
            got[index] = label
    return got, it.audits[-1]


@pytest.mark.parametrize("fast", [True, False], ids=["mini-batch 32", "mini-batch 4"])
def test_labels_with_signs_zeros_and_whitespace_arrive_whole(tmp_path, transfer, fast):
    forms = [b"%d", b" %d\n", b"+%d", b"\t000%d \r\n", b"-%d", b"%d" + b" " * 60]
    paths = write(tmp_path, lambda i: forms[i % len(forms)] % i)
    got, _ = labels(paths, transfer, fast=fast)
    assert got == {i: -i if i % len(forms) == 4 else i for i in range(SHARDS * PER_SHARD)}


BAD = {
    "7, 63 spaces, 8": b"7" + b" " * 63 + b"8",
    "65 digits": b"0" * 64 + b"5",
    "underscore": b"1_000",
    "10 MB": b"9" * (10 << 20),
}


@pytest.mark.parametrize("text", list(BAD.values()), ids=list(BAD))
def test_a_label_that_is_not_one_whole_integer_is_named_or_skipped(tmp_path, transfer, text):
    paths = write(tmp_path, lambda i: text if i == int(BAD_KEY) else b"%d" % i)
    with pytest.raises(ShardFormatError, match="'label' must hold") as err:
        labels(paths, transfer)
    assert err.value.url.endswith("n-1.tar") and err.value.key == BAD_KEY and "What to do" in str(err.value)
    got, audit = labels(paths, transfer, on_error="skip")
    assert got == {i: i for i in range(SHARDS * PER_SHARD) if i != int(BAD_KEY)}
    assert audit["skipped"] == [int(BAD_KEY)]
