"""A mix of a remote stream (served over HTTP, through faults) and a local one: each stream's
exact count, every draw once, the remote samples' bytes as read locally, on both batchings."""

from collections import Counter

import numpy as np
import pytest

from dali_shards import Stream
from dali_shards.pytorch import DALIShardedIterator
from dali_shards.testing.pipelines import identity_pipeline, jpg_bytes
from dali_shards.testing.servers import HTTPShardServer

pytest.importorskip("aiohttp")
SIZES = (5, 0, 9, 3, 8, 6)
PATTERN = "remote-{000000..000005}.tar"


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_a_remote_and_a_local_stream_mix_exactly(shard_dir, make_shards, batching):
    local = make_shards((4, 4, 3), prefix="local")
    reference = jpg_bytes(str(shard_dir / PATTERN))
    with HTTPShardServer(str(shard_dir)) as http:
        http.faults.fail = 2
        mix = [Stream(f"{http.url}/{PATTERN}", proportion=2), Stream(local, proportion=1)]
        factory = identity_pipeline(mix, ("__index__", "__stream__", "__valid__", "jpg"), epoch_size=45, batching=batching,
                                    batch_size=4, py_num_workers=2, world_size=2, shuffle=True, seed=5)  # fmt: skip
        for epoch in range(2):
            draws, data = Counter(), {}
            for rank in range(2):
                it = DALIShardedIterator(factory(rank=rank), ["index", "stream", "valid", "jpg"], audit=True)
                for _ in range(epoch + 1):
                    batches = list(it)
                for (b,) in batches:
                    ok = b["valid"].reshape(-1).numpy().astype(bool)
                    index, stream = b["index"].reshape(-1).numpy(), b["stream"].reshape(-1).numpy()
                    for k in np.flatnonzero(ok):
                        draws[(int(stream[k]), int(index[k]))] += 1
                        data[int(index[k])] = b["jpg"][k].numpy().tobytes()
                assert all(a["exactly_once"] for a in it.audits), it.audits
            per_stream = Counter(s for (s, _), n in draws.items() for _ in range(n))
            assert [per_stream[0], per_stream[1]] == [30, 15], f"epoch {epoch}"
            assert max(n for (s, _), n in draws.items() if s == 0) == 1, "30 of the 31 remote samples, each once"
            assert {i: data[i] for i in data if i < 31} == {i: reference[i] for i in data if i < 31}
        assert http.faults.fail == 0, "the faults happened and were retried"
