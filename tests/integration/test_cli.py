"""The dali-shards command: write, index, inspect, plan."""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from dali_shards.cli import main, parse_size
from dali_shards.catalog.scan import scan_shards
from dali_shards.catalog.manifest import load_index, read_manifest
from dali_shards.plan.epoch import PlanSpec
from dali_shards.sample_data import ROOT as PHOTOS
from dali_shards.sample_data import sample_images, write_sample_shards
from dali_shards.catalog.sources import resolve_source


def cli(*args):
    return main([str(a) for a in args])


def digest(paths):
    return [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths]


def test_help_for_every_command(capsys):
    for command in ([], ["write"], ["index"], ["inspect"], ["plan"]):
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--help"])
        assert exit_.value.code == 0
    assert "ImageFolder" in capsys.readouterr().out


def test_write_an_image_folder(tmp_path, capsys):
    out = tmp_path / "a"
    assert cli("write", PHOTOS, out / "train-%04d.tar", "--max-count", 10, "--shuffle", "--seed", 3, "--quiet") == 0
    shards = sorted(str(p) for p in out.glob("train-*.tar"))
    assert len(shards) == 5
    manifest = read_manifest(str(out / "manifest.json"))
    assert [s.samples for s in manifest] == [10, 10, 10, 10, 7]
    scanned = scan_shards([os.path.join(str(out), s.url) for s in manifest])
    assert [load_index(s).offsets.tolist() for s in manifest] == [s.offsets.tolist() for s in scanned], "sample offsets recorded"
    assert [s.samples for s in scan_shards(shards)] == [10, 10, 10, 10, 7]
    classes = json.loads((out / "classes.json").read_text())
    assert len(classes) == 19 and sorted(classes.values()) == list(range(19))
    # every photo once, with its class index (ImageFolder order) as .cls
    import webdataset as wds

    photos = {open(p.path, "rb").read(): classes[str(p.label)] for p in sample_images()}
    seen = {}
    for s in wds.WebDataset(shards, shardshuffle=False):
        seen[s["jpg"]] = int(s["cls"])
    assert seen == photos
    # deterministic whatever the parallelism
    again = tmp_path / "b"
    cli(
        "write",
        PHOTOS,
        again / "train-%04d.tar",
        "--max-count",
        10,
        "--shuffle",
        "--seed",
        3,
        "--quiet",
        "--processes",
        1,
    )
    assert digest(shards) == digest(sorted(str(p) for p in again.glob("train-*.tar")))
    assert "wrote 47 samples into 5 shards" in capsys.readouterr().out


def test_write_warns_about_stale_shards(tmp_path, capsys):
    out = tmp_path / "s"
    cli("write", PHOTOS, out / "t-%03d.tar", "--max-count", 5, "--quiet")
    cli("write", PHOTOS, out / "t-%03d.tar", "--max-count", 40, "--quiet")
    err = capsys.readouterr().err
    assert "8 files left from an earlier write" in err and "t-002.tar" in err
    assert [s.samples for s in read_manifest(str(out / "manifest.json"))] == [40, 7]


def test_write_with_numeric_classes_and_max_size(tmp_path):
    out = tmp_path / "n"
    assert cli("write", PHOTOS, out / "s-%03d.tar.gz", "--numeric-classes", "--max-size", "100K", "--quiet") == 0
    shards = sorted(str(p) for p in out.glob("s-*.tar.gz"))
    assert len(shards) > 5
    labels = sorted(int(s["cls"]) for s in __import__("webdataset").WebDataset(shards, shardshuffle=False))
    assert labels == sorted(p.label for p in sample_images())


@pytest.mark.parametrize("limit", ["50K", "100K", "300K"])
def test_max_size_bounds_the_tar_files(tmp_path, limit):
    """Headers, padding, end blocks and tarfile's record padding all count towards --max-size."""
    out = tmp_path / "m"
    assert cli("write", PHOTOS, out / "s-%03d.tar", "--max-size", limit, "--quiet") == 0
    bound = parse_size(limit)
    sizes = [os.path.getsize(p) for p in out.glob("s-*.tar")]
    too_big = [s for s in sizes if s > bound]
    singles = [n for n in read_manifest(str(out / "manifest.json")) if n.bytes > bound]
    assert len(too_big) == len(singles) and all(n.samples == 1 for n in singles)
    assert sum(n.samples for n in read_manifest(str(out / "manifest.json"))) == len(sample_images())


def test_a_max_size_no_tar_file_can_meet_is_refused(tmp_path, capsys):
    assert cli("write", PHOTOS, tmp_path / "o" / "s-%03d.tar", "--max-size", "5K") == 2
    assert "smallest tar file" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_shard_writer_bounds_its_files(tmp_path):
    from dali_shards.tools.writer import ShardWriter

    with ShardWriter(str(tmp_path / "w-%03d.tar"), max_size=50 * 1024) as w:
        for i in range(40):
            w.write({"__key__": f"{i:04d}", "bin": b"x" * 3000, "cls": i})
    assert all(os.path.getsize(p) <= 50 * 1024 for p in w.paths) and len(w.paths) > 1


def test_a_mistyped_folder_is_not_read_as_a_file_list(tmp_path, capsys):
    assert cli("write", tmp_path / "nonexist", tmp_path / "out" / "s-%03d.tar") == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "file list" in err and "cannot read" not in err
    assert not (tmp_path / "out").exists(), "a failed write leaves no output folder"


def test_a_file_list_names_where_relative_paths_point(tmp_path, capsys):
    lst = tmp_path / "lists" / "l.txt"
    lst.parent.mkdir()
    lst.write_text("photos/a.jpg 1\n")
    assert cli("write", lst, tmp_path / "o" / "s-%03d.tar") == 2
    err = capsys.readouterr().err
    assert "l.txt:1" in err and "relative paths are taken from the list's folder" in err
    assert str(tmp_path / "lists" / "photos" / "a.jpg") in err


def test_a_file_list_mixing_labelled_and_unlabelled_lines_is_refused(tmp_path, capsys):
    photos = sample_images()[:3]
    lst = tmp_path / "l.txt"
    lst.write_text(f"{photos[0].path} 3\n{photos[1].path} 4\n{photos[2].path}\n")
    assert cli("write", lst, tmp_path / "o" / "s-%03d.tar") == 2
    err = capsys.readouterr().err
    assert "l.txt:3" in err and "lacks a label but line 1 has one" in err


def test_rewriting_warns_about_stale_index_files(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli("write", PHOTOS, out / "s-%03d.tar", "--max-count", "10", "--quiet", "--numeric-classes") == 0
    assert cli("index", out / "s-*.tar", "--quiet") == 0
    for p in out.glob("s-*.tar"):
        p.unlink()
    capsys.readouterr()
    assert cli("write", PHOTOS, out / "s-%03d.tar", "--max-count", "100", "--quiet", "--numeric-classes") == 0
    err = capsys.readouterr().err
    assert "files left from an earlier write" in err and ".idx" in err


def test_inspect_counts_only_readable_shards(tmp_path, capsys):
    paths = write_sample_shards(str(tmp_path), shard_sizes=(3, 4))
    damaged = [tmp_path / f"bad-{i}.tar" for i in range(2)]
    for path in damaged:
        path.write_bytes(b"garbage" * 100)
    assert cli("inspect", *paths, *damaged, "--quiet") == 1
    out = capsys.readouterr().out
    assert "min 3, max 4, empty 0, unreadable 2" in out


def test_write_mixes_samples_by_default_and_inspect_reports_clustering(tmp_path, capsys):
    """`dali-shards write` shuffles across shards unless --no-shuffle; inspect tells the two apart."""
    import webdataset as wds

    def labels_of(out):
        shards = sorted(str(p) for p in out.glob("s-*.tar"))
        return [int(s["cls"]) for s in wds.WebDataset(shards, shardshuffle=False)]

    mixed, again, ordered = tmp_path / "mixed", tmp_path / "again", tmp_path / "ordered"
    assert cli("write", PHOTOS, mixed / "s-%02d.tar", "--max-count", 12, "--quiet", "--numeric-classes") == 0
    assert cli("write", PHOTOS, again / "s-%02d.tar", "--max-count", 12, "--quiet", "--numeric-classes") == 0
    assert cli("write", PHOTOS, ordered / "s-%02d.tar", "--max-count", 12, "--quiet", "--numeric-classes",
               "--no-shuffle") == 0
    def runs(labels):  # how many stretches of one label
        return 1 + sum(a != b for a, b in zip(labels, labels[1:]))

    classes = len(set(labels_of(ordered)))
    assert runs(labels_of(ordered)) == classes, "class by class"
    assert runs(labels_of(mixed)) > 2 * classes and sorted(labels_of(mixed)) == sorted(labels_of(ordered))
    for a, b in zip(sorted(mixed.glob("s-*.tar")), sorted(again.glob("s-*.tar"))):
        assert a.read_bytes() == b.read_bytes(), "seeded: the same input gives the same shards"
    capsys.readouterr()
    assert cli("inspect", ordered / "s-*.tar", "--quiet") == 0
    out = capsys.readouterr()
    assert "labels (.cls)" in out.out and "look class-sorted" in out.err
    assert cli("inspect", mixed / "s-*.tar", "--quiet") == 0
    assert "look class-sorted" not in capsys.readouterr().err


def test_write_keys_samples_by_their_file_names(tmp_path, capsys):
    import webdataset as wds

    photos = sample_images()
    assert cli("write", PHOTOS, tmp_path / "a" / "t-%02d.tar", "--quiet") == 0
    keys = {s["__key__"]: s["jpg"] for s in wds.WebDataset(str(tmp_path / "a" / "t-00.tar"), shardshuffle=False)}
    assert keys == {os.path.splitext(os.path.basename(p.path))[0]: open(p.path, "rb").read() for p in photos}
    assert "keyed other than" not in capsys.readouterr().err
    assert cli("write", PHOTOS, tmp_path / "n" / "t-%02d.tar", "--quiet", "--numbered-keys", "--no-shuffle") == 0
    numbered = [s["__key__"] for s in wds.WebDataset(str(tmp_path / "n" / "t-00.tar"), shardshuffle=False)]
    assert numbered == [f"{i:08d}" for i in range(len(photos))]


def test_write_makes_keys_of_clashing_and_dotted_names_unique(tmp_path, capsys):
    import webdataset as wds

    data = open(sample_images()[0].path, "rb").read()
    for rel in ("a/x.jpg", "b/x.jpg", "b/x_2.jpg", "c/v1.2.photo.jpg"):
        os.makedirs(tmp_path / "src" / os.path.dirname(rel), exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(data)
    assert cli("write", tmp_path / "src", tmp_path / "o" / "t-%02d.tar", "--quiet", "--no-shuffle") == 0
    samples = list(wds.WebDataset(str(tmp_path / "o" / "t-00.tar"), shardshuffle=False))
    assert [(s["__key__"], int(s["cls"])) for s in samples] == [("x", 0), ("x_3", 1), ("x_2", 1), ("v1_2_photo", 2)]
    assert all(s["jpg"] == data for s in samples)
    err = capsys.readouterr().err
    assert "2 files keyed other than by their name" in err and "b/x.jpg -> 'x_3'" in err


def test_write_a_file_list(tmp_path):
    photos = sample_images()[:6]
    lst = tmp_path / "list.txt"
    lines = [
        "# path label",
        *(f"{p.path} {i * 7}" for i, p in enumerate(photos[:5])),
        os.path.relpath(photos[5].path, tmp_path) + " 35",
    ]
    lst.write_text("\n".join(lines) + "\n")
    assert cli("write", lst, tmp_path / "o" / "l-%02d.tar", "--quiet", "--no-shuffle") == 0
    import webdataset as wds

    samples = list(wds.WebDataset(str(tmp_path / "o" / "l-00.tar"), shardshuffle=False))
    assert [int(s["cls"]) for s in samples] == [0, 7, 14, 21, 28, 35]
    assert samples[5]["jpg"] == open(photos[5].path, "rb").read()
    assert not (tmp_path / "o" / "classes.json").exists()
    unlabelled = tmp_path / "plain.txt"
    unlabelled.write_text("".join(f"{p.path}\n" for p in photos))
    assert cli("write", unlabelled, tmp_path / "u" / "l-%02d.tar", "--quiet") == 0
    assert all("cls" not in s for s in wds.WebDataset(str(tmp_path / "u" / "l-00.tar"), shardshuffle=False))


@pytest.mark.parametrize(
    "args, message",
    [
        (["write", PHOTOS, "out.tar"], "%-format"),
        (["write", "/no/such/list.txt", "o-%d.tar"], "does not exist: give an ImageFolder root"),
        (["write", PHOTOS, "o-%d.tar", "--class-map", "/no/map.json"], "cannot read class map"),
        (["plan", "/no/such-{0..1}.tar", "--world-size", "1", "--workers", "1", "--batch-size", "1"], "file not found"),
        (["inspect", "/no/dir/*.tar"], "matches no files"),
    ],
)
def test_clear_errors(tmp_path, capsys, args, message):
    os.chdir(tmp_path)
    assert cli(*args) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith(f"dali-shards {args[0]}: error:")


def test_numeric_classes_need_numbers(tmp_path, capsys):
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.jpg").write_bytes(b"x")
    assert cli("write", tmp_path, tmp_path / "o-%d.tar", "--numeric-classes") == 2
    assert "numeric class directories" in capsys.readouterr().err


def test_index_writes_manifest_and_dali_index(tmp_path):
    paths = write_sample_shards(str(tmp_path), shard_sizes=(4, 0, 7))
    assert cli("index", tmp_path / "sample-*.tar", "--quiet") == 0
    indexed = read_manifest(str(tmp_path / "manifest.json"))
    assert [s.samples for s in indexed] == [4, 0, 7]
    assert [len(load_index(s).offsets) for s in indexed] == [5, 1, 8], "sample offsets recorded (an empty shard: its end)"
    assert resolve_source(str(tmp_path / "manifest.json")) == resolve_source(paths)
    # the index files are the ones DALI's wds2idx writes, and DALI's reader uses them
    wds2idx = os.path.join(os.path.dirname(sys.executable), "wds2idx")
    for p in (paths[0], paths[2]):
        ref = p + ".ref"
        subprocess.run([wds2idx, p, ref], check=True, capture_output=True)
        assert open(p.replace(".tar", ".idx")).read() == open(ref).read()
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=11, num_threads=1, device_id=None)
    def native():
        return fn.readers.webdataset(
            paths=[paths[0], paths[2]], index_paths=[paths[0][:-4] + ".idx", paths[2][:-4] + ".idx"], ext=["cls"]
        )

    pipe = native()
    pipe.build()
    (cls,) = pipe.run()
    labels = [p.label for p in sample_images()]
    assert [int(bytes(np.array(c))) for c in cls] == labels[:11]


def test_index_names_idx_files_by_the_full_stem(tmp_path):
    """train.000.tar and train.001.tar get train.000.idx and train.001.idx, 16 shards on 8 threads."""
    from dali_shards.tools.writer import write_shard

    for i in range(16):
        write_shard(str(tmp_path / f"train.{i:03d}.tar"), [{"__key__": f"k{i}-{j}", "cls": str(j)} for j in range(i % 3 + 1)])
    assert cli("index", tmp_path / "train.*.tar", "--threads", "8", "--quiet") == 0
    for i in range(16):
        lines = open(tmp_path / f"train.{i:03d}.idx").read().splitlines()
        assert lines[0] == f"v1.2 {i % 3 + 1}"
    assert not list(tmp_path.glob("*.tmp*"))
    assert [s.samples for s in read_manifest(str(tmp_path / "manifest.json"))] == [i % 3 + 1 for i in range(16)]


def test_index_refuses_two_shards_sharing_an_index_file(tmp_path, capsys):
    from dali_shards.tools.writer import write_shard

    write_shard(str(tmp_path / "a.tar"), [{"__key__": "x", "cls": "1"}])
    write_shard(str(tmp_path / "a.tar.gz"), [{"__key__": "y", "cls": "1"}])
    assert cli("index", tmp_path / "a.tar", tmp_path / "a.tar.gz") == 2
    assert "would share the index file" in capsys.readouterr().err


def test_index_refuses_compressed_shards_for_dali(tmp_path, capsys):
    from dali_shards.tools.writer import write_shard

    write_shard(str(tmp_path / "z.tar.gz"), [{"__key__": "a", "txt": "x"}])
    assert cli("index", tmp_path / "z.tar.gz") == 2
    assert "uncompressed" in capsys.readouterr().err
    assert cli("index", tmp_path / "z.tar.gz", "--no-idx", "--quiet") == 0


def test_inspect_reports_what_is_wrong(tmp_path, capsys):
    good = tmp_path / "a.tar"
    with tarfile.open(good, "w") as tar:
        for name, data in [
            ("k1.jpg", b"x" * 100),
            ("k1.cls", b"1"),
            ("k2.jpg", b"y" * 300),
            ("k3.jpg", b"z"),
            ("k3.cls", b"3"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dup = tmp_path / "b.tar"
    with tarfile.open(dup, "w") as tar:
        for name in ("k3.jpg", "k3.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    tarfile.open(tmp_path / "c.tar", "w").close()
    (tmp_path / "d.tar").write_bytes(b"garbage" * 100)
    assert cli("inspect", tmp_path, "--json", "--quiet") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["samples"] == 4 and report["shards"] == 4
    assert report["fields"]["cls"]["missing"] == 1 and report["fields"]["cls"]["missing_examples"] == ["k2"]
    assert report["fields"]["jpg"]["size_min_p50_p90_p99_max"][-1] == 300
    assert report["duplicate_keys"] == 1 and report["duplicate_examples"][0]["key"] == "k3"
    assert report["empty_shards"] == [str(tmp_path / "c.tar")]
    assert "d.tar" in report["unreadable_shards"][0]["error"]
    assert cli("inspect", good, "--quiet") == 0
    text = capsys.readouterr().out
    assert "1 shards, 3 samples" in text and "e.g. missing in: k2" in text
    from dali_shards.catalog.manifest import write_manifest

    write_manifest(str(tmp_path / "m.json"), scan_shards([str(good), str(dup)]))
    assert cli("inspect", tmp_path / "m.json", "--quiet") == 0
    assert "2 shards, 4 samples" in capsys.readouterr().out


def test_plan_matches_the_planner_without_dali(tmp_path):
    write_sample_shards(str(tmp_path), shard_sizes=(11, 0, 17, 3, 16))
    code = (
        "import sys, json, io, contextlib\n"
        "from dali_shards.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    main(['plan', {str(tmp_path)!r} + '/sample-*.tar', '--world-size', '3', '--workers', '2',\n"
        "          '--batch-size', '4', '--shuffle', '--seed', '5', '--epoch', '2', '--json'])\n"
        "assert not any(m.startswith('nvidia.dali') for m in sys.modules)\n"
        "print(buf.getvalue())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    spec = PlanSpec((11, 0, 17, 3, 16), world_size=3, py_num_workers=2, batch_size=4, seed=5, shuffle=True)
    assert plan["steps_per_rank"] == spec.steps_per_epoch == 4
    assert plan["padding"] == spec.padding_per_epoch == 3 * 4 * 4 - 47
    assert sum(w["samples"] for r in plan["ranks"] for w in r["workers"]) == 47
    reads = [(x["shard"], x["samples"]) for r in plan["ranks"] for w in r["workers"] for x in w["reads"]]
    names = [f"sample-{i:06d}.tar" for i in range(5)]
    planned = [(names[g.shard], [g.first, g.stop]) for v in range(6) for g in spec.epoch(2).worker_reads(v)]
    assert reads == planned and plan["readers_per_shard"] >= 1


def test_plan_text(tmp_path, capsys):
    write_sample_shards(str(tmp_path), shard_sizes=(5, 5))
    assert (
        cli("plan", tmp_path, "--world-size", "2", "--workers", "1", "--batch-size", "4", "--last-batch", "drop") == 0
    )
    text = capsys.readouterr().out
    assert "1 steps on every rank; 8 samples delivered, 0 padding slots, 2 dropped" in text
    assert "rank 1:" in text and "sample-000001.tar[" in text


@pytest.mark.parametrize("batching", ["random", "stratified"])
def test_plan_of_a_mix_shows_each_streams_draws(tmp_path, capsys, batching):
    a = write_sample_shards(str(tmp_path / "a"), shard_sizes=(6, 6))
    b = write_sample_shards(str(tmp_path / "b"), shard_sizes=(10, 9))
    args = ["plan", "--stream", f"repeat=2:{tmp_path / 'a'}", "--stream", f"proportion=1:{tmp_path / 'b'}",
            "--epoch-size", "40", "--batching", batching, "--world-size", "2", "--workers", "2", "--batch-size", "4", "--shuffle"]  # fmt: skip
    assert cli(*args, "--json") == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(s["draws"], s["delivered"], s["samples"], s["shards"]) for s in plan["streams"]] == [(24, 24, 12, 2), (16, 16, 19, 2)]
    assert plan["batching"] == batching and plan["samples"] == 40
    workers = [w for r in plan["ranks"] for w in r["workers"]]
    assert [sum(w["per_stream"][i] for w in workers) for i in range(2)] == [24, 16]
    assert cli(*args) == 0
    text = capsys.readouterr().out
    assert "24 draws (60.0% of the epoch), 24 delivered" in text and "a/sample-000000.tar[" in text
    assert len(a) == len(b) == 2
    with pytest.raises(SystemExit):
        cli("plan", "--stream", f"choose=x:{tmp_path / 'a'}", "--workers", "1", "--batch-size", "1")
    assert "choose must be a number" in capsys.readouterr().err
    assert cli("plan", "--stream", f"choose=50:{tmp_path / 'a'}", "--epoch-size", "10", "--workers", "1", "--batch-size", "1") == 2
    assert "stream 0 (" in (err := capsys.readouterr().err) and "choose=50 is more than epoch_size=10" in err


@pytest.mark.parametrize("stream, words", [
    ("repeat=1e308", "repeat=1e+308 of its 12 samples makes inf draws per epoch, more than the 1099511627776"),
    ("repeat=1e12", "repeat=1e+12 of its 12 samples makes 1.2e+13 draws per epoch"),
    ("repeat=3e6", "stretches of shards (a shard in a pass), more than the 4194304 an epoch may hold; stream 0 takes"),
])  # fmt: skip
def test_plan_of_a_mix_too_large_to_plan_is_an_error_not_a_traceback_or_a_hang(tmp_path, capsys, stream, words):
    write_sample_shards(str(tmp_path / "a"), shard_sizes=(6, 6))
    assert cli("plan", "--stream", f"{stream}:{tmp_path / 'a'}", "--workers", "1", "--batch-size", "4") == 2
    err = capsys.readouterr().err
    assert err.startswith("dali-shards plan: error: ") and words in err and "Traceback" not in err, err


def test_parse_size():
    assert parse_size("500M") == 500 << 20 and parse_size("1.5G") == int(1.5 * (1 << 30))
    assert parse_size("64KiB") == 64 << 10 and parse_size("1234") == 1234
