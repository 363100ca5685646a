"""World resolution under torch.distributed (needs torch: not a unit test)."""

import sys

from dali_shards.world import resolve_world


def test_resolve_world_from_torch_distributed(monkeypatch, tmp_path):
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "7")
    monkeypatch.setenv("RANK", "5")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", world_size=1, rank=0)
    try:
        assert resolve_world() == (1, 0), "an initialized process group wins over the environment"
    finally:
        dist.destroy_process_group()
    assert "torch" in sys.modules
