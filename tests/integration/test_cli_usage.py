"""The dali-shards command's usage: suggestions for mistyped options and commands, help for every
option, --version, a missing path, plan's defaults, and a reader that stops early (| head)."""

import argparse
import os
import subprocess
import sys

import pytest

import dali_shards
from dali_shards.cli import build_parser, main
from dali_shards.sample_data import write_sample_shards

PLAN = ["--workers", "1", "--batch-size", "2"]


def cli(*args):
    return main([str(a) for a in args])


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan", "x.tar", "--world-sise", "2", *PLAN], "arguments: --world-sise: did you mean --world-size?"),
        (["plan", "x.tar", "--world-size", "1", "--workers", "1", "--bach-size=2"], "did you mean --batch-size?"),
        (["inspect", "x.tar", "-quiet"], "did you mean --quiet?"),
        (["inspec", "x.tar"], "invalid choice: 'inspec'"),
        (["inspec", "x.tar"], "did you mean inspect?"),
        (["--verison"], "did you mean --version?"),
    ],
)
def test_mistyped_options_and_commands_get_suggestions(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        cli(*args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unknown_option_with_nothing_close_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli("inspect", "x.tar", "--zzzzzz")
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unrecognized arguments: --zzzzzz" in err and "did you mean" not in err


def test_abbreviations_and_negative_numbers_still_parse(tmp_path, capsys):
    write_sample_shards(str(tmp_path), shard_sizes=(3, 2))
    assert cli("plan", tmp_path, "--work", "1", "--batch", "2", "--seed", "-5", "--shuffle") == 0
    assert "shuffled, seed -5" in capsys.readouterr().out


def test_plan_defaults_to_one_rank(tmp_path, capsys):
    write_sample_shards(str(tmp_path), shard_sizes=(3, 2))
    assert cli("plan", tmp_path, *PLAN) == 0
    assert "1 ranks x 1 workers" in capsys.readouterr().out


def test_every_option_has_help():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in [("", parser), *sub.choices.items()]:
        bare = [a.dest for a in command._actions if not a.help and not isinstance(a, argparse._SubParsersAction)]
        assert not bare, f"dali-shards {name}: options without help: {bare}"


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli("--version")
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"dali-shards {dali_shards.__version__}"


@pytest.mark.parametrize("command", ["inspect", "index"])
def test_a_missing_path_is_an_error_naming_it(tmp_path, capsys, command):
    write_sample_shards(str(tmp_path), shard_sizes=(3,))
    missing = tmp_path / "no-such.tar"
    assert cli(command, tmp_path / "sample-000000.tar", missing, "--quiet") == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"dali-shards {command}: error: shard {str(missing)!r}: file not found")
    assert "field" not in captured.out, "no empty table"


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    """`dali-shards plan ... | head`: no '[Errno 32] Broken pipe', no traceback."""
    write_sample_shards(str(tmp_path), shard_sizes=(3, 2))
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dali_shards.cli", "plan", str(tmp_path), *PLAN, "--world-size", "1"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode == 141
