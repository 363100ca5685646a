"""Real multi-process runs under torchrun (gloo, CPU): exactly once, equal steps, no hang."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def torchrun(tmp_path, world, sizes, epochs=2, batch=4, workers=2, last_batch="pad"):
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "torchrun"),
        "--standalone",
        "--nproc_per_node",
        str(world),
        os.path.join(HERE, "ddp_job.py"),
        str(tmp_path),
        ",".join(map(str, sizes)),
        str(epochs),
        str(batch),
        str(workers),
        last_batch,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)})  # torchrun leaves its logs in TMPDIR
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((tmp_path / "audit.json").read_text())


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize(
    "sizes",
    [(0, 1, 97, 2, 0, 33), (3,)],
    ids=["very uneven shards", "fewer samples than virtual workers"],
)
def test_ranks_see_every_sample_once_with_equal_steps(tmp_path, world, sizes):
    result = torchrun(tmp_path, world, sizes)
    assert result["world"] == world and len(result["audits"]) == 2
    for audit in result["audits"]:
        assert audit["ranks"] == world
        assert audit["exactly_once"], audit
        assert audit["expected"] == sum(sizes) and audit["duplicates"] == 0 and audit["missing"] == 0
        assert len(set(audit["steps_per_rank"])) == 1


def test_drop_last_under_torchrun(tmp_path):
    result = torchrun(tmp_path, 3, (40, 13, 0, 21), last_batch="drop")
    for audit in result["audits"]:
        assert audit["exactly_once"] and audit["expected"] == 74 // 12 * 12
