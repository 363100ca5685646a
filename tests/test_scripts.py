"""The README's main job (the quickstart) and the benchmark run end to end."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, timeout):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_quickstart_checks_exactly_once():
    out = run(
        ["examples/quickstart.py", "--epochs", "2", "--world-size", "3", "--workers", "2", "--batch-size", "4"], 300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("-> exactly once") == 2
    assert "exactly-once check: passed" in out.stdout


def test_throughput_benchmark_runs(tmp_path):
    result = tmp_path / "throughput.json"
    out = run(
        [
            "benchmarks/throughput.py",
            "--samples",
            "1024",
            "--batch-size",
            "64",
            "--rounds",
            "1",
            "--epochs",
            "1",
            "--modes",
            "bytes",
            "--data-dir",
            str(tmp_path / "data"),
            "--out",
            str(result),
        ],
        600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(result.read_text())
    loaders = report["results"]["bytes"]
    assert set(loaders) == {"dali_shards", "native_webdataset", "plain_4892"}
    assert all(r["samples_per_s"] > 0 for r in loaders.values())
    assert report["ratios"]["bytes_vs_plain_4892"] > 0
