"""Ranks that built different plans get a clear ConfigError on every rank, not a DDP hang
(torchrun, gloo, CPU; hard time limit)."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_job(tmp_path, mode):
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "torchrun"),
        "--standalone",
        "--nproc_per_node",
        "2",
        os.path.join(HERE, "ddp_plan_job.py"),
        str(tmp_path),
        mode,
    ]
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the ranks hung: {exc}")
    results = {}
    for rank in range(2):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing: " + out.stdout[-2000:] + out.stderr[-3000:]
        results[rank] = json.loads(path.read_text())
    return results


def test_ranks_with_different_shards_fail_clearly_on_every_rank(tmp_path):
    results = run_job(tmp_path, "differ")
    for rank, result in results.items():
        assert "error" in result, f"rank {rank} went on: {result}"
        assert "planned different epochs" in result["error"]
        assert "3 steps, 17 samples" in result["error"] and "2 steps, 13 samples" in result["error"]
    assert results[0]["alone"] == 5, "a world-size-1 pipeline on one rank is not checked against the others"


def test_ranks_with_the_same_shards_run(tmp_path):
    results = run_job(tmp_path, "same")
    assert [r.get("steps") for r in results.values()] == [3, 3], results
