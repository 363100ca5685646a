"""ShardedOptions / StorageOptions: defaults once, every bad value a ConfigError naming the option."""

import dataclasses

import pytest

from dali_shards.errors import ConfigError
from dali_shards.plan.mixture import Stream
from dali_shards.options import (
    OPTION_KEYWORDS,
    STORAGE_KEYWORDS,
    LastBatch,
    OnError,
    ShardedOptions,
    StorageOptions,
)

BASE = dict(source="d/train-{0..3}.tar", fields=("jpg", "cls"), batch_size=8, py_num_workers=2)


def make(**kw):
    return ShardedOptions.from_keywords(**{**BASE, **kw})


def test_defaults_and_strings_compare_equal_to_enums():
    opts = make(on_error="skip", last_batch="drop")
    assert opts.on_error is OnError.SKIP and opts.on_error == "skip" and f"{opts.on_error}" == "skip"
    assert opts.last_batch is LastBatch.DROP
    assert opts.shuffle is False and opts.seed == 0 and opts.worker_prefetch == 2
    assert opts.storage == StorageOptions()
    assert not opts.streaming and make(samples_per_epoch=100).streaming


def test_keywords_round_trip():
    opts = make(read_ahead=0, cache_dir="/tmp/c", cache_limit=10, seed=7, on_error="skip")
    flat = opts.keywords()
    assert set(flat) == set(OPTION_KEYWORDS)
    assert flat["on_error"] == "skip" and type(flat["on_error"]) is str
    assert ShardedOptions.from_keywords(**flat) == opts
    assert opts.replace(read_ahead=3).storage.read_ahead == 3
    assert opts.replace(seed=8).seed == 8 and opts.seed == 7


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("seed", None, "seed must be an integer"),
        ("seed", 1.5, "seed must be an integer"),
        ("worker_prefetch", 0, "worker_prefetch must be a positive integer"),
        ("batch_size", 7, "multiple of py_num_workers"),
        ("batch_size", True, "batch_size must be a positive integer"),
        ("py_num_workers", 0, "py_num_workers must be a positive integer"),
        ("shuffle_buffer", -1, "shuffle_buffer must be a positive integer"),
        ("start_epoch", -3, "start_epoch must be a non-negative integer"),
        ("start_epoch", 2.7, "start_epoch must be a non-negative integer"),
        ("start_epoch", 2**63, "start_epoch must be at most 2147483646"),
        ("world_size", 0, "world_size must be a positive integer or None"),
        ("rank", 2, "rank must be in 0..1"),
        ("on_error", "ignore", "on_error must be one of 'raise', 'skip'"),
        ("last_batch", "partial", "last_batch must be one of 'pad', 'drop'"),
        ("stale_manifest", "warn", "stale_manifest must be one of"),
        ("shuffle", "yes", "shuffle must be True or False"),
        ("samples_per_epoch", 0, "samples_per_epoch must be a positive integer or None"),
        ("worker_timeout", 0, "worker_timeout must be a positive number of seconds or None"),
        ("worker_timeout", float("nan"), "worker_timeout must be a positive number"),
        ("resume_from", "state.json", "resume_from must be a state_dict()"),
        ("fields", "jpg", "fields must be a non-empty sequence"),
        ("fields", ("jpg", "jpg"), "distinct"),
        ("source", "", "source is empty"),
        ("source", [], "source must be a non-empty list"),
        ("source", 3, "source must be a path"),
        ("source", Stream("d/a.tar", repeat=2), "source is one Stream (Stream(source='d/a.tar', proportion=None, repeat=2"),
        ("read_ahead", -1, "read_ahead must be a non-negative integer"),
        ("retries", 1.0, "retries must be a non-negative integer"),
        ("request_timeout", 0, "request_timeout must be a positive number of seconds"),
        ("cache_limit", 10, "cache_limit=10 needs cache_dir"),
        ("storage_options", "endpoint", "storage_options must be a dict"),
        ("decoders", {"jpg": "bytes"}, "decoders= says how fields are decoded for map=, and there is no map"),
    ],
)
def test_bad_values_are_config_errors_naming_the_option(name, value, words):
    kw = {name: value}
    if name == "rank":
        kw["world_size"] = 2
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        make(**kw)


def test_unknown_option_is_refused():
    with pytest.raises(ConfigError, match="unknown sharded_pipeline option"):
        make(shuffle_bufer=10)


def test_defaults_are_written_once():
    """The decorator's keywords are the options' fields: no second copy of any default."""
    import inspect
    import pathlib

    src = pathlib.Path(inspect.getsourcefile(ShardedOptions)).parent
    for path in src.rglob("*.py"):
        if path.name == "options.py":
            continue
        text = path.read_text()
        for needle in ("shuffle_buffer: int = 1024", "worker_prefetch: int = 2", 'on_error: str = "raise"'):
            assert needle not in text, f"{path} repeats the default {needle!r}"


def test_storage_options_are_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        StorageOptions({})  # type: ignore[misc]
    opts = StorageOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.read_ahead = 3  # type: ignore[misc]
    assert set(STORAGE_KEYWORDS) <= {f.name for f in dataclasses.fields(StorageOptions)}


def _literal_defaults_outside_options(root=None):
    """(path, line, option) for every literal default of an option written outside ``options.py``:
    a parameter, a dataclass field or an argparse ``default=`` of the option's name whose value is
    the option's default (it should say ``option_default(name)``)."""
    import ast
    import inspect
    import pathlib

    defaults = {}
    for cls in (ShardedOptions, StorageOptions):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING and f.default is not None:
                defaults[f.name] = getattr(f.default, "value", f.default)
    found = []
    root = root or pathlib.Path(inspect.getsourcefile(ShardedOptions)).parent
    for path in pathlib.Path(root).rglob("*.py"):
        if path.name == "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            for name, value in _defaults_in(node):
                try:
                    literal = ast.literal_eval(value)
                except ValueError:
                    continue
                if name in defaults and name not in _OTHER_MEANINGS.get(path.name, ()) and literal == defaults[name]:
                    found.append((str(path), value.lineno, name))
    return found


# names an option shares with something else: `dali-shards write --seed` seeds the writer's shuffle
_OTHER_MEANINGS = {"folderwriter.py": ("seed",), "write_command.py": ("seed",)}


def _defaults_in(node):
    import ast

    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = node.args
        positional = a.posonlyargs + a.args
        yield from ((x.arg, d) for x, d in zip(positional[len(positional) - len(a.defaults):], a.defaults))
        yield from ((x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        yield node.target.id, node.value
    elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
        flag = getattr(node.args[0], "value", "")
        if isinstance(flag, str):
            yield from ((flag.lstrip("-").replace("-", "_"), k.value) for k in node.keywords if k.arg == "default")


def test_every_options_default_is_written_once():
    """Every option with a default: no parameter, field or command-line flag of its name repeats it."""
    assert not _literal_defaults_outside_options(), "write option_default(name) instead"


def test_the_defaults_check_finds_a_repeated_default(tmp_path):
    """The check above is not vacuous: each way of repeating a default is found, other values are not."""
    (tmp_path / "m.py").write_text(
        "def f(shuffle_buffer: int = 1024, batching='random', seed=7): pass\n"
        "class C:\n    transfer: str = 'ring'\n"
        "p.add_argument('--bucket-window', type=int, default=1024)\n"
    )
    assert sorted(name for _, _, name in _literal_defaults_outside_options(tmp_path)) == [
        "batching", "bucket_window", "shuffle_buffer", "transfer"]
