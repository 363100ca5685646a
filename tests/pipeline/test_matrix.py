"""The contract in every pair of combinations (``dali_shards.testing.matrix``): start method x
transfer x plan x source x storage x queues, each configuration over two epochs on two ranks, a
resume under the same layout and on three ranks, every sample checked against its tar. The whole
grid: ``python -m dali_shards.testing.matrix --all``."""

import logging

import pytest

from dali_shards.testing import matrix
from dali_shards.testing.servers import HTTPShardServer


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    with HTTPShardServer(str(root)) as server:
        yield str(root), server.url


@pytest.mark.parametrize("config", matrix.pairwise(), ids=str)
def test_the_contract_holds(config, served, caplog):
    root, url = served
    with caplog.at_level(logging.ERROR, logger="dali_shards"):  # the few-shards and compressed-shards notes
        checked = matrix.check(config, root, url if config.storage == "http" else None)
    assert len(set(checked["steps"])) == 1
