"""`dali-shards write` and `index` on the Ray engine (a local Ray instance of 2 CPUs shared by the
module) against local processes: the same bytes for trees, file lists and Parquet, whatever the
number of processes or tasks; a task or the driver killed; remote inputs and outputs; bad input."""

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dali_shards.cli import main
from dali_shards.errors import ConfigError
from dali_shards.options import StorageOptions
from dali_shards.sample_data import sample_images
from dali_shards.testing.servers import HTTPShardServer, S3Server
from dali_shards.tools.folderwriter import write_dataset

ray = pytest.importorskip("ray")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
PHOTOS = os.path.dirname(os.path.dirname(sample_images()[0].path))
pytestmark = pytest.mark.usefixtures("ray_instance")  # one Ray instance for the module (tests/integration/conftest.py)


def files_of(folder):
    """{relative path: bytes} of every file under ``folder``."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "**"), recursive=True)):
        if os.path.isfile(path):
            out[os.path.relpath(path, folder)] = open(path, "rb").read()
    return out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A file list and a Parquet folder (row groups of 7 and 5 rows) of the built-in photos."""
    root = tmp_path_factory.mktemp("inputs")
    images = sample_images()
    (root / "list.txt").write_text("".join(f"{img.path} {img.label}\n" for img in images))
    rows = [{"image": {"bytes": open(img.path, "rb").read(), "path": os.path.basename(img.path)},
             "label": img.label, "meta": {"n": i}} for i, img in enumerate(images)]  # fmt: skip
    table = pa.Table.from_pylist(rows)
    (root / "pq").mkdir()
    pq.write_table(table.slice(0, 30), root / "pq" / "a.parquet", row_group_size=7)
    pq.write_table(table.slice(30), root / "pq" / "b.parquet", row_group_size=5)
    return {"tree": PHOTOS, "list": str(root / "list.txt"), "parquet": str(root / "pq")}


OPTIONS = {"tree": {}, "list": {"max_size": 100_000}, "parquet": {"columns": "jpg=image,cls=label,json=meta", "window": 12}}


@pytest.mark.parametrize("kind", ("tree", "list", "parquet"))
def test_the_same_bytes_on_every_engine_and_number_of_tasks(kind, inputs, tmp_path):
    runs = {"processes-1": dict(processes=1), "processes-2": dict(processes=2),
            **{f"ray-{n}": dict(engine="ray", tasks=n) for n in (1, 2, 4)}}  # fmt: skip
    written = {}
    for name, engine in runs.items():
        result = write_dataset(inputs[kind], str(tmp_path / name / "s-%03d.tar"), max_count=6, seed=5,
                               **OPTIONS[kind], **engine)  # fmt: skip
        assert result.samples == 47 and result.reused == 0
        written[name] = files_of(tmp_path / name)
    first = written.pop("processes-1")
    assert len([n for n in first if n.endswith(".tar")]) >= 8 and "manifest.json" in first
    assert (kind == "tree") == ("classes.json" in first)
    for name, files in written.items():
        assert files == first, f"{kind}: {name} differs from one local process"


def slow_list(tmp_path, server):
    """A file list of the photos served (slowly) by ``server``, and the reference shards of it."""
    images = sample_images()
    for img in images:
        os.link(img.path, tmp_path / "served" / os.path.basename(img.path))
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"{server.url}/{os.path.basename(img.path)} {img.label}\n" for img in images))
    write_dataset(str(lst), str(tmp_path / "want" / "s-%03d.tar"), max_count=5, processes=1)
    return lst


def test_a_task_killed_mid_shard_is_run_again_and_the_output_is_the_same(tmp_path):
    (tmp_path / "served").mkdir()
    with HTTPShardServer(str(tmp_path / "served")) as server:
        lst = slow_list(tmp_path, server)
        server.faults.rate = 150_000  # bytes/s: a shard takes about a second
        out = tmp_path / "out"
        killer, killed = kill_a_writer(out)
        assert write_dataset(str(lst), str(out / "s-%03d.tar"), max_count=5, engine="ray").samples == 47
        killer.join(60)
        assert killed  # a task's process, mid-shard: Ray ran the task again
    assert files_of(out) == files_of(tmp_path / "want")


def kill_a_writer(out):
    """A thread that SIGKILLs the first process seen writing a shard into ``out`` (named in its
    temporary file), and the list it puts its pid in."""
    killed = []

    def kill():
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for tmp in glob.glob(str(out / ".tmp*-s-*.tar"))[:1]:
                killed.append(int(os.path.basename(tmp)[4:].split("-")[0]))
                os.kill(killed[0], signal.SIGKILL)
            time.sleep(0.05)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread, killed


def test_a_local_writer_killed_is_a_clear_error_and_a_rerun_completes(tmp_path):
    from dali_shards.errors import WorkerError

    (tmp_path / "served").mkdir()
    with HTTPShardServer(str(tmp_path / "served")) as server:
        lst = slow_list(tmp_path, server)
        server.faults.rate = 150_000
        out = tmp_path / "out"
        killer, killed = kill_a_writer(out)
        with pytest.raises(WorkerError, match="a writer process died .* run the same command again"):
            write_dataset(str(lst), str(out / "s-%03d.tar"), max_count=5, processes=2)
        killer.join(60)
        assert killed
        server.faults.rate = 0
        assert write_dataset(str(lst), str(out / "s-%03d.tar"), max_count=5, processes=2).samples == 47
    assert files_of(out) == files_of(tmp_path / "want")


def test_a_killed_driver_rerun_keeps_the_finished_shards(tmp_path, ray_instance, capsys):
    (tmp_path / "served").mkdir()
    with HTTPShardServer(str(tmp_path / "served")) as server:
        lst = slow_list(tmp_path, server)
        server.faults.rate = 150_000
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "dali_shards.cli", "write", str(lst), str(out / "s-%03d.tar"), "--max-count", "5",
               "--engine", "ray", "--ray-address", ray_instance, "--tasks", "10", "--quiet"]  # fmt: skip
        driver = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 90
        while len(glob.glob(str(out / ".dali-shards-write" / "*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
        done = [os.path.basename(f)[: -len(".json")] for f in glob.glob(str(out / ".dali-shards-write" / "*.json"))]
        assert 2 <= len(done) < 10 and not (out / "manifest.json").exists()
        inodes = {name: os.stat(out / name).st_ino for name in done}
        server.faults.rate = 0
        capsys.readouterr()
        assert main(cmd[3:-5] + ["--engine", "ray", "--quiet"]) == 0  # the same command, on this Ray
        said = capsys.readouterr().out
        reused = int(said.split("; ")[1].split()[0])
        assert f"{reused} complete shards of an earlier run kept" in said and reused >= len(done)
        assert {name: os.stat(out / name).st_ino for name in done} == inodes  # kept, not written again
    assert files_of(out) == files_of(tmp_path / "want")


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    server = S3Server()
    yield server
    server.stop()


def progress_lines(err):
    """The progress bar's states in ``err`` (tqdm's carriage returns), and the lines it ended."""
    return [s for s in err.replace("\n", "\r").split("\r") if s.strip()], err.count("\n")


def test_inputs_and_shards_on_s3_then_the_loader_reads_each_sample_once(s3, tmp_path, capsys):
    from dali_shards.testing.pipelines import assert_exactly_once, epochs_by_rank, index_pipeline

    images = sample_images()
    client = s3.client()
    client.create_bucket(Bucket="data")
    for img in images:
        client.upload_file(img.path, "data", "tree/" + os.path.relpath(img.path, PHOTOS))
    options = s3.storage_options()
    args = ["write", "s3://data/tree", "s3://data/shards/s-%03d.tar", "--max-count", "10",
            "--storage-options", json.dumps(options)]  # fmt: skip
    capsys.readouterr()
    assert main(args + ["--engine", "ray"]) == 0
    states, lines = progress_lines(capsys.readouterr().err)  # one progress line for the whole job
    assert lines == 1 and all(s.startswith("writing shards:") for s in states), states
    assert "47/47" in states[-1] and "5/5 shards (0 kept)" in states[-1] and "MB/s" in states[-1]
    assert main(["write", PHOTOS, str(tmp_path / "s-%03d.tar"), "--max-count", "10", "--quiet"]) == 0
    listed = client.list_objects_v2(Bucket="data", Prefix="shards/")["Contents"]
    assert sorted(o["Key"][len("shards/"):] for o in listed) == sorted(files_of(tmp_path))  # no fragments left
    assert_same_objects(client, "data", "shards/", files_of(tmp_path))  # the same bytes as from the local tree
    make = index_pipeline("s3://data/shards/manifest.json", batch_size=4, py_num_workers=2, world_size=2,
                          storage_options=options)
    seen, data, _, _ = epochs_by_rank(make, world=2, epochs=1)
    assert_exactly_once(seen, len(images))
    assert sorted(data.values()) == sorted(open(img.path, "rb").read() for img in images)


def assert_same_objects(client, bucket, prefix, want):
    """The objects under ``prefix`` of ``bucket`` hold ``want``'s bytes (manifests: the same JSON)."""
    for name, data in want.items():
        got = client.get_object(Bucket=bucket, Key=prefix + name)["Body"].read()
        assert got == data if name != "manifest.json" else json.loads(got) == json.loads(data), name


def test_parquet_on_s3_written_on_ray_is_the_local_write(s3, inputs, tmp_path, capsys):
    client = s3.client()
    client.create_bucket(Bucket="parquet")
    for name in sorted(os.listdir(inputs["parquet"])):
        client.upload_file(os.path.join(inputs["parquet"], name), "parquet", f"in/{name}")
    want = tmp_path / "want"
    write_dataset(inputs["parquet"], str(want / "s-%03d.tar"), max_count=6, seed=5, **OPTIONS["parquet"])
    storage = StorageOptions(storage_options=s3.storage_options())
    result = write_dataset("s3://parquet/in", "s3://parquet/out/s-%03d.tar", max_count=6, seed=5, engine="ray", tasks=3,
                           storage=storage, **OPTIONS["parquet"])  # fmt: skip
    assert result.samples == 47 and result.manifest == "s3://parquet/out/manifest.json"
    listed = client.list_objects_v2(Bucket="parquet", Prefix="out/")["Contents"]
    assert sorted(o["Key"][len("out/"):] for o in listed) == sorted(files_of(want))
    assert_same_objects(client, "parquet", "out/", files_of(want))
    capsys.readouterr()  # written again, in fewer shards: those left over are said, as for a local output
    args = ["write", "s3://parquet/in", "s3://parquet/out/s-%03d.tar", "--max-count", "24", "--seed", "5",
            "--window", "12", "--columns", OPTIONS["parquet"]["columns"],
            "--storage-options", json.dumps(s3.storage_options()), "--engine", "ray", "--quiet"]  # fmt: skip
    assert main(args) == 0
    said = capsys.readouterr()
    fewer = int(said.out.split(" into ")[1].split()[0])  # "wrote 47 samples into N shards"
    assert 0 < fewer < len(result.shards)
    assert f"{len(result.shards) - fewer} files left from an earlier write" in said.err, said.err
    assert "e.g. s3://parquet/out/s-" in said.err


@pytest.mark.parametrize("where", ("local", "http"))
def test_index_on_ray_writes_what_the_one_machine_scan_writes(where, make_shards, tmp_path):
    shards = make_shards((7, 0, 12, 5), folder=tmp_path / "shards")
    for engine in ("local", "ray"):
        manifest = tmp_path / engine / "manifest.json"
        manifest.parent.mkdir()
        if where == "local":
            assert main(["index", *shards, "--manifest", str(manifest), "--quiet", "--engine", engine]) == 0
        else:
            with HTTPShardServer(str(tmp_path / "shards")) as server:
                urls = [f"{server.url}/{os.path.basename(s)}" for s in shards]
                assert main(["index", *urls, "--manifest", str(manifest), "--quiet", "--engine", engine]) == 0
                text = manifest.read_text().replace(server.url, "URL")
                manifest.write_text(text)
    assert files_of(tmp_path / "local") == files_of(tmp_path / "ray")


@pytest.mark.parametrize("engine", ("local", "ray"))
def test_bad_input_gives_the_same_errors_on_both_engines(engine, inputs, tmp_path, capsys):
    def write(src, *extra):
        capsys.readouterr()
        code = main(["write", str(src), str(tmp_path / engine / "o" / "s-%03d.tar"), "--quiet", "--engine", engine,
                     *(["--processes", "2"] if engine == "local" else []), *extra])  # fmt: skip
        return code, capsys.readouterr().err

    tree = tmp_path / engine / "tree"
    (tree / "cat").mkdir(parents=True)
    for i, img in enumerate(sample_images()[:4]):
        os.link(img.path, tree / "cat" / f"{i}.jpg")
    os.symlink(tmp_path / "gone.jpg", tree / "cat" / "9.jpg")  # listed, unreadable
    code, err = write(tree)
    assert code == 2 and f"error: cannot read input file {str(tree / 'cat' / '9.jpg')!r}: not found" in err
    code, err = write(inputs["parquet"], "--columns", "jpg=picture")
    assert code == 2 and "has no column 'picture' (for jpg=picture); its columns: image, label, meta" in err
    pq.write_table(pa.table({"image": [b"x"], "label": ["cat"]}), tmp_path / engine / "strings.parquet")
    code, err = write(tmp_path / engine / "strings.parquet")
    assert code == 2 and "label column 'label' holds string, not integers" in err
    pq.write_table(pa.table({"image": pa.array([], pa.binary()), "label": pa.array([], pa.int64())}),
                   tmp_path / engine / "empty.parquet")  # fmt: skip
    code, err = write(tmp_path / engine / "empty.parquet")
    assert code == 2 and "the input holds no rows to write" in err
    os.remove(tree / "cat" / "9.jpg")
    assert write(tree, "--max-count", "1")[0] == 0
    code, err = write(tree, "--max-count", "4")  # over shards of another write
    assert code == 0 and "3 files left from an earlier write" in err


def test_a_ray_dataset_from_python(inputs, tmp_path):
    import ray.data

    ds = ray.data.read_parquet(inputs["parquet"])
    one = write_dataset(ds, str(tmp_path / "a" / "s-%03d.tar"), engine="ray", max_count=10, tasks=1)
    two = write_dataset(ds, str(tmp_path / "b" / "s-%03d.tar"), engine="ray", max_count=10, tasks=3)
    assert one.samples == two.samples == 47 and files_of(tmp_path / "a") == files_of(tmp_path / "b")
    from dali_shards.tools.inspect import inspect_shards

    report = inspect_shards([s.url for s in one.shards], threads=2, progress=False)
    assert report["samples"] == 47 and report["duplicate_keys"] == 0
    with pytest.raises(ConfigError, match="needs engine='ray'"):
        write_dataset(ds, str(tmp_path / "c" / "s-%03d.tar"), processes=1)
    floats = ray.data.from_items([{"image": b"x", "label": 1.5}])
    with pytest.raises(ConfigError, match="holds double, not integers"):
        write_dataset(floats, str(tmp_path / "d" / "s-%03d.tar"), engine="ray")
