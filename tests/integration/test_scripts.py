"""The examples and benchmarks run end to end (small sizes)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args, timeout, **kw):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)


def test_quickstart_checks_exactly_once():
    out = run(
        [
            sys.executable,
            "examples/quickstart.py",
            "--epochs",
            "2",
            "--world-size",
            "3",
            "--workers",
            "2",
            "--batch-size",
            "4",
        ],
        300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("-> exactly once") == 2
    assert "exactly-once check: passed" in out.stdout


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_mixture_example_measures_exact_proportions(batching):
    out = run([sys.executable, "examples/mixture.py", "--epochs", "3", "--batch-size", "7", "--workers", "1", "--batching", batching], 300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("delivered per stream [24, 72, 24]") == 3
    assert "exact per-epoch proportions, pass after pass: passed" in out.stdout


def _log(path):
    return [json.loads(line) for line in open(path)]


def test_training_example_on_the_builtin_data_and_resume(tmp_path):
    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    script = [sys.executable, "examples/imagenet_tar_train.py", "--log-json", str(log), "--checkpoint", str(ck)]
    out = run(script + ["--epochs", "2"], 300)
    assert out.returncode == 0, out.stdout + out.stderr
    epochs = _log(log)
    assert [e["epoch"] for e in epochs] == [0, 1]
    for e in epochs:
        assert e["val_images"] == e["val_images_expected"] == 47, "every validation image exactly once"
        assert 0 <= e["top1"] <= 1 and 0 <= e["data_wait_fraction"] <= 1 and e["images_per_s"] > 0
        assert e["train_loss"] == e["train_loss"]  # not NaN
    assert "top-1" in out.stdout and "images/s" in out.stdout
    state = json.loads((ck / "loader.json").read_text())
    assert state["epoch"] == 2 and state["history"] == []  # saved after epoch 1 ended: epoch 2 is next

    # resumed with a longer schedule, the run goes on from epoch 2 (not from 0) with the saved model
    out = run(script + ["--epochs", "3", "--resume", str(ck)], 300)
    assert out.returncode == 0, out.stdout + out.stderr
    resumed = _log(log)[2:]
    assert [e["epoch"] for e in resumed] == [2] and resumed[0]["val_images"] == 47
    assert "epoch 0:" not in out.stdout
    assert json.loads((ck / "loader.json").read_text())["epoch"] == 3


def test_jax_example_trains_on_the_builtin_data_exactly_once_and_checkpoints_through_orbax(tmp_path):
    pytest.importorskip("optax")
    ck = tmp_path / "ck"
    out = run([sys.executable, "examples/jax_train.py", "--out-dir", str(tmp_path), "--checkpoint", str(ck)], 300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("training images exactly once") == 2 and "images/s" in out.stdout
    epochs = _log(tmp_path / "train_log.jsonl")
    assert [e["epoch"] for e in epochs] == [0, 1]
    for e in epochs:
        assert e["val_images"] == e["val_images_expected"] == 47 and e["train_images"] == 47 and e["exactly_once"]
        assert e["train_loss"] == e["train_loss"] and 0 <= e["top1"] <= 1 and e["steps"] == 6  # not NaN
    state = json.loads((ck / "1" / "loader" / "process_0-of-1.json").read_text())  # saved after epoch 1 ended
    assert state["epoch"] == 2 and state["history"] == [] and (ck / "1" / "model").is_dir()


def test_text_example_tokenizes_in_the_workers_and_bucketing_cuts_padding(tmp_path):
    """The language-model example: stdlib docstrings as shards, a tokenizer's bound method as the
    map, bucketed batches padded by DALI; one short epoch."""
    out = run([sys.executable, "examples/text_lm_train.py", "--epochs", "2", "--steps-per-epoch", "15", "--modules",
               "60", "--out-dir", str(tmp_path)], 300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    epochs = _log(tmp_path / "train_log.jsonl")
    assert [e["epoch"] for e in epochs] == [0, 1] and all(e["steps"] == 15 for e in epochs)
    for e in epochs:
        assert e["loss"] == e["loss"] and e["tokens_per_s"] > 0 and 0 <= e["data_wait_fraction"] <= 1
        assert e["padding_reduction"] >= 3, e  # batch 32: bucketing pads at least 3x less
    assert "tokens/s" in out.stdout and "bucketed vs" in out.stdout


def test_training_example_on_imagenet_style_jpeg_files(tmp_path):
    """An ImageNet-like tree (class folders of *.JPEG files) written by `dali-shards write` trains."""
    import shutil

    from dali_shards.sample_data import sample_images

    tree = tmp_path / "imagenet" / "train"
    for image in sample_images()[:24]:
        folder = tree / f"n{image.label:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(image.path, folder / (os.path.basename(image.path).rsplit(".", 1)[0] + ".JPEG"))
    shards = tmp_path / "shards"
    out = run([sys.executable, "-m", "dali_shards.cli", "write", str(tree), str(shards / "%06d.tar"),
               "--shuffle", "--max-count", "8"], 120)
    assert out.returncode == 0, out.stdout + out.stderr
    import tarfile

    with tarfile.open(shards / "000000.tar") as tar:
        assert {m.name.rsplit(".", 1)[1] for m in tar.getmembers()} == {"jpg", "cls"}
    log = tmp_path / "log.jsonl"
    manifest = str(shards / "manifest.json")
    out = run([sys.executable, "examples/imagenet_tar_train.py", "--data", manifest, "--val-data", manifest,
               "--epochs", "1", "--log-json", str(log)], 300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _log(log)[0]["val_images"] == 24


def test_training_example_writes_its_log_under_the_output_folder(tmp_path):
    out = run([sys.executable, "examples/imagenet_tar_train.py", "--epochs", "1", "--steps-per-epoch", "1",
               "--out-dir", str(tmp_path / "run")], 300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(_log(tmp_path / "run" / "train_log.jsonl")) == 1
    assert not os.path.exists(os.path.join(ROOT, "train_log.jsonl"))


def test_training_example_on_remote_shards(tmp_path):
    pytest.importorskip("aiohttp")
    from dali_shards.catalog.scan import scan_shards
    from dali_shards.catalog.manifest import write_manifest
    from dali_shards.sample_data import write_sample_shards
    from dali_shards.testing.servers import HTTPShardServer

    served = tmp_path / "served"
    write_manifest(str(served / "manifest.json"), scan_shards(write_sample_shards(str(served), (11, 0, 17, 3, 16))))
    log, cache = tmp_path / "log.jsonl", tmp_path / "cache"
    with HTTPShardServer(str(served)) as http:
        out = run(
            [
                sys.executable,
                "examples/imagenet_tar_train.py",
                "--data",
                f"{http.url}/manifest.json",
                "--val-data",
                f"{http.url}/sample-{{000000..000004}}.tar",  # counts from the manifest beside them
                "--epochs",
                "1",
                "--storage-options",
                '{"client_kwargs": {}}',
                "--cache-dir",
                str(cache),
                "--log-json",
                str(log),
            ],
            300,
        )
    assert out.returncode == 0, out.stdout + out.stderr
    (epoch,) = _log(log)
    assert epoch["val_images"] == epoch["val_images_expected"] == 47
    assert len([f for f in os.listdir(cache) if f.endswith(".shard")]) == 4


def test_training_example_under_torchrun(tmp_path):
    log = tmp_path / "log.jsonl"
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = run(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node",
            "2",
            "examples/imagenet_tar_train.py",
            "--workers",
            "1",
            "--epochs",
            "1",
            "--log-json",
            str(log),
        ],
        300,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # torchrun leaves its logs in TMPDIR
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (epoch,) = _log(log)
    assert epoch["val_images"] == 47 and epoch["steps"] == 3  # ceil(47 / (2 ranks x 8))


def test_detection_example_trains_on_ragged_boxes(tmp_path):
    out = run([sys.executable, "examples/detection_train.py", "--steps-per-epoch", "3", "--out-dir", str(tmp_path)], 600)
    assert out.returncode == 0, out.stdout + out.stderr
    (epoch,) = _log(tmp_path / "train_log.jsonl")
    assert epoch["images"] == 12 and epoch["steps"] == 3  # batch 4 on the CPU
    assert epoch["loss"] == epoch["loss"] and 0 < epoch["loss"] < 100, "a finite loss"
    assert isinstance(epoch["example_key"], str) and epoch["boxes"] > 0
    assert "images/s, waiting for data" in out.stdout


def test_training_example_help():
    out = run([sys.executable, "examples/imagenet_tar_train.py", "--help"], 60)
    assert out.returncode == 0 and "--arch" in out.stdout and "--val-data" in out.stdout


@pytest.mark.parametrize("script", sorted(f"examples/{n}" for n in os.listdir(os.path.join(ROOT, "examples")) if n.endswith(".py")))
def test_example_help_gives_the_whole_first_paragraph(script):
    out = run([sys.executable, script, "--help"], 60)
    doc = open(os.path.join(ROOT, script)).read().split('"""')[1]
    first = " ".join(doc.split("\n\n")[0].split())
    assert out.returncode == 0, out.stderr
    assert first in " ".join(out.stdout.split()), f"{script} --help cuts its description: {out.stdout}"


def test_throughput_benchmark_runs(tmp_path):
    result = tmp_path / "throughput.json"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    tree = tmp_path / "tree"  # an "earlier version" for --baseline: a copy of the package
    shutil.copytree(os.path.join(ROOT, "dali_shards"), tree / "dali_shards")
    out = run(
        [
            sys.executable,
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
            "--workers",
            "1,2",
            "--data-dir",
            str(tmp_path / "data"),
            "--out",
            str(result),
            "--baseline",
            str(tree),
        ],
        600,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(result.read_text())
    runs = {(r["loader"], r["workers"]): r for r in report["results"]}
    assert set(runs) == {("ring", 1), ("merge", 1), ("ring", 2), ("merge", 2), ("native_webdataset", 1),
                         ("plain_4892", 2), ("ring@baseline", 1), ("ring@baseline", 2)}  # fmt: skip
    assert all(r["samples_per_s"] > 0 and r["main_process_cpu_ms_per_step"] > 0 for r in runs.values())
    assert "bytes_ring_vs_merge_2_workers" in report["ratios"] and "bytes_ring_vs_baseline_2_workers" in report["ratios"]
    # the baseline's runs imported the package from its tree, the others from this one
    assert {tuple(r["dali_shards_from"]) for k, r in runs.items() if k[0] == "ring@baseline"} == {(str(tree),)}
    assert all(r["dali_shards_from"] != [str(tree)] for k, r in runs.items() if k[0] != "ring@baseline")
    assert os.listdir(tmp) == [], "the measurement processes leave nothing in $TMPDIR"


def test_jax_throughput_benchmark_runs(tmp_path):
    pytest.importorskip("jax")
    result = tmp_path / "jax.json"
    out = run([sys.executable, "benchmarks/jax_throughput.py", "--samples", "256", "--batch-size", "32", "--rounds", "1",
               "--epochs", "1", "--mode", "decode", "--data-dir", str(tmp_path / "data"), "--out", str(result)], 600)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(result.read_text())
    assert set(report["results"]) == {"pytorch", "jax"} and all(r["samples_per_s"] > 0 for r in report["results"].values())
    assert report["ratios"]["jax_vs_pytorch"] > 0 and "| jax |" in (tmp_path / "jax.md").read_text()


def test_shuffle_quality_benchmark_runs(tmp_path):
    out = run([sys.executable, "benchmarks/shuffle_quality.py", "--classes", "40", "--per-class", "50",
               "--shard-size", "100", "--ranks", "1,2", "--workers", "2", "--batches", "8", "--steps", "4",
               "--shuffle-buffer", "16", "--peers", "--peer-data", "20,30,20,8", "--plot", "--out", str(tmp_path / "sq")],
              300)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads((tmp_path / "sq.json").read_text())["rows"]
    assert len(rows) == 2 and all(0 < r["class_sorted_block0"] < r["class_sorted_block256"] for r in rows)
    assert (tmp_path / "sq.md").exists() and (tmp_path / "sq.png").stat().st_size > 1000
    mix = json.loads((tmp_path / "sq.json").read_text())["peers"]["class_mix"]
    assert set(mix) >= {"dali_shards", "DALI readers.webdataset (random_shuffle)"} and all(v > 0 for v in mix.values())


def test_compare_benchmark_runs(tmp_path):
    out = run(
        [
            sys.executable,
            "benchmarks/compare.py",
            "--quick",
            "--scaling",
            "",
            "--loaders",
            "dali_shards,webdataset_dataloader,dali_proxy",
            "--data-dir",
            str(tmp_path / "data"),
            "--out-dir",
            str(tmp_path / "results"),
        ],
        900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "results" / "compare.json").read_text())
    ours = report["audit"]["dali_shards"]
    assert all(e["duplicates"] == 0 and e["missing"] == 0 and e["equal_steps"] for e in ours["epochs"])
    assert report["throughput"]["augment"]["dali_shards"]["samples_per_s"] > 0
    assert "not_applicable" in report["throughput"]["bytes"]["dali_proxy"]
    assert (tmp_path / "results" / "compare.md").exists() and (tmp_path / "results" / "compare.png").exists()


def test_remote_benchmark_runs(tmp_path):
    pytest.importorskip("moto")
    out = run(
        [
            sys.executable,
            "benchmarks/remote.py",
            "--quick",
            "--latency-ms",
            "20",
            "--data-dir",
            str(tmp_path / "data"),
            "--out-dir",
            str(tmp_path / "results"),
        ],
        900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "results" / "remote-quick.json").read_text())
    rows = {r["config"]: r for r in report["results"]}
    assert len(rows) == 5 and all(r["samples_per_s"] and not r["errors"] for r in rows.values()), rows


def test_scale_benchmark_runs_and_meets_its_targets_on_small_cases(tmp_path):
    """benchmarks/scale.py on its quick cases: each in a fresh process, a table and JSON; the
    readers per shard (a count, not a time) within target."""
    cases = "order-10k,elastic-10m,readers-2000,readers-20000"
    out = run([sys.executable, "benchmarks/scale.py", "--cases", cases, "--data-dir", str(tmp_path / "data"),
               "--out", str(tmp_path / "scale.json")], 600)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads((tmp_path / "scale.json").read_text())["results"]
    assert set(results) == set(cases.split(",")) and not any("error" in r for r in results.values()), results
    assert results["readers-2000"]["readers_per_shard"] <= 9.0 and results["readers-20000"]["readers_per_shard"] <= 2.0


def test_scale_benchmark_catalog_cases_run_on_a_tiny_manifest(tmp_path):
    """benchmarks/scale.py's catalog cases (issue 47) on their tiny size: a rank that builds the
    node's copy, one that maps it, one and two ranks of a node; each reads every shard."""
    cases = "catalog-smoke,catalog-smoke-warm,node-smoke-1,node-smoke-2"
    out = run([sys.executable, "benchmarks/scale.py", "--cases", cases, "--data-dir", str(tmp_path / "data"),
               "--out", str(tmp_path / "scale.json")], 600)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    results = json.loads((tmp_path / "scale.json").read_text())["results"]
    assert set(results) == set(cases.split(",")) and not any("error" in r for r in results.values()), results
    assert all(r["shards"] == 4000 for r in results.values()) and results["node-smoke-2"]["ranks"] == 2


def test_worker_cost_stages_name_modules_that_exist(monkeypatch):
    """worker_cost.py splits a profile into stages by module path: a renamed module must not fall
    silently into 'plan and order'."""
    monkeypatch.setattr(sys, "path", [os.path.join(ROOT, "benchmarks"), *sys.path])  # (restored after)
    monkeypatch.delitem(sys.modules, "worker_cost", raising=False)
    import worker_cost
    for suffix in worker_cost._PARSE + worker_cost._PACK:
        assert os.path.exists(os.path.join(ROOT, "dali_shards", suffix)), suffix
    package = os.path.join(ROOT, "dali_shards")
    assert worker_cost.stage_of(os.path.join(package, "tar", "blocks.py"), "parse_round") == "parse"
    assert worker_cost.stage_of(os.path.join(package, "worker", "located.py"), "located_fields") == "parse"
    assert worker_cost.stage_of(os.path.join(package, "worker", "imagecheck.py"), "_jpegs_ok") == "check"
    assert worker_cost.stage_of(os.path.join(package, "ipc", "packing.py"), "pack") == "pack"
    assert worker_cost.stage_of(os.path.join(package, "ipc", "tables.py"), "write") == "hand-over"
    assert worker_cost.stage_of("~", "<built-in method posix.preadv>") == "read"
    assert worker_cost.stage_of(os.path.join(package, "worker", "direct.py"), "__next__") == "plan and order"
