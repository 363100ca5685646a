"""Shuffle before shard with too few shards to interleave: one shard read by two ranks gives each
rank another part of it every epoch, every sample once an epoch, and a warning says what to do."""

import logging

import pytest

from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.pipelines import identity_pipeline


@pytest.mark.parametrize("shuffle_block", [256, 0])
def test_one_shard_gives_each_rank_another_part_every_epoch(make_shards, transfer, shuffle_block, caplog):
    (shard,) = make_shards((60,), prefix="one")
    factory = identity_pipeline([shard], ("__index__", "__valid__"), batch_size=3, py_num_workers=1, world_size=2,
                                shuffle=True, seed=5, shuffle_block=shuffle_block, transfer=transfer)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="dali_shards"):
        its = [DALIShardedIterator(factory(rank=r), ["index", "valid"]) for r in range(2)]
    assert ("too few to interleave" in caplog.text) == bool(shuffle_block), "said only where interleaving was asked"
    per_epoch = []
    for _ in range(3):
        got = []
        for it in its:
            mine = []
            for (batch,) in it:
                mine += batch["index"].reshape(-1).tolist()  # padding is dropped by the iterator
            got.append(mine)
        assert sorted(got[0] + got[1]) == list(range(60)), "every sample once an epoch"
        per_epoch.append(frozenset(got[0]))
    assert len(set(per_epoch)) == 3, "rank 0 reads another part of the shard every epoch"
