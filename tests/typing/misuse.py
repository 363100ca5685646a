"""Mistakes ``mypy`` must catch in dali_shards' public API (tests/integration/test_typing.py)."""

from typing import Any

from dali_shards import ShardWriter, sharded_pipeline
from dali_shards.pytorch import DALIShardedIterator


@sharded_pipeline("train-{0..9}.tar", fields=("jpg",), batch_size="8", py_num_workers=2)  # batch_size: str
def pipe(jpg: Any) -> Any:
    return jpg


sharded_pipeline("x.tar", shufle=True)  # a misspelled option
ShardWriter("out-%d.tar", max_count="10")  # max_count: str
DALIShardedIterator(pipe(), ["x"], keep_padding="yes")  # keep_padding: str
pipe(sed=3)  # a misspelled option where the pipeline is made
DALIShardedIterator(pipe(), ["x"], ragged="lists")  # not one of "list", "pad"
