"""What a worker receives is exactly what the main process holds: every ``WorkerConfig`` the
resolver produces, in every mode (planned or streaming x ring or merge x with a ``map`` or without
x a mix or one dataset x bucketing or not, one worker and two), pickled (as a spawned ring worker
gets it, and inside the merge's source, as DALI's pool gets it) and compared with the original,
attribute by attribute down to the slot format, the codec and the user's code."""

import dataclasses
import enum
import itertools
import pickle
from collections.abc import Mapping

import numpy as np
import pytest

from dali_shards.errors import ConfigError
from dali_shards.options import ShardedOptions
from dali_shards.plan.mixture import Stream
from dali_shards.setup.resolve import resolve
from dali_shards.transfer.merge.source import MergeSource
from dali_shards.worker.usercode import Portable

MAP_OUTPUTS = ("image", "label", "__index__")


def to_outputs(sample):
    return {"image": sample["jpg"], "label": sample["cls"]}


def length(sample):
    return len(sample.get("jpg", sample.get("image", b"")))


def state(obj):
    """Everything ``obj`` holds, as plain data that compares by value (a user callable by what
    travels of it: its loaded function is each process's own)."""
    if obj is None or isinstance(obj, (str, bytes, int, float, bool, enum.Enum)):
        return obj
    if isinstance(obj, np.ndarray):
        return "ndarray", obj.dtype.str, obj.shape, obj.tobytes()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Portable):
        return "Portable", state(obj.__getstate__())
    if isinstance(obj, Mapping):
        return type(obj).__name__, sorted(((state(k), state(v)) for k, v in obj.items()), key=repr)
    if isinstance(obj, (list, tuple)):
        return type(obj).__name__, [state(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return type(obj).__name__, sorted((state(v) for v in obj), key=repr)
    if dataclasses.is_dataclass(obj):
        return type(obj).__name__, {f.name: state(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "__dict__"):
        return type(obj).__name__, {k: state(v) for k, v in vars(obj).items()}
    raise TypeError(f"no state known for {type(obj).__name__}")


GRID = [
    dict(mode=m, transfer=t, mapped=mp, mix=mx, bucketing=b, workers=w)
    for m, t, mp, mx, b, w in itertools.product(
        ("planned", "streaming"), ("ring", "merge"), (False, True), (False, True), (False, True), (1, 2)
    )
]
REFUSED = [g for g in GRID if g["mode"] == "streaming" and (g["mix"] or g["bucketing"])]  # (options.py says why)


@pytest.fixture(scope="module")
def datasets(make_shards):
    return make_shards((5, 4, 6)), make_shards((3, 7), prefix="other")


def options(datasets, mode, transfer, mapped, mix, bucketing, workers):
    first, second = datasets
    fields = ("jpg", "cls", "__key__", "__index__") + (("__stream__",) if mix else ())
    kw = dict(
        source=[Stream(first), Stream(second, proportion=1)] if mix else first, fields=fields,
        batch_size=2 * workers, py_num_workers=workers, transfer=transfer, world_size=2, rank=1, shuffle=True,
        seed=7, map=to_outputs if mapped else None, bucket_by=length if bucketing else None,
        samples_per_epoch=40 if mode == "streaming" else None,
    )  # fmt: skip
    return ShardedOptions.from_keywords(**kw)


@pytest.mark.parametrize("case", [g for g in GRID if g not in REFUSED], ids=lambda g: "-".join(map(str, g.values())))
def test_a_worker_receives_exactly_what_the_main_process_holds(datasets, case):
    resolved = resolve(options(datasets, **case), MAP_OUTPUTS if case["mapped"] else ())
    assert len(resolved.workers) == case["workers"]
    for config in resolved.workers:
        assert config.stage.packing is config.packing and config.packing is resolved.packing
        held = state(config)
        assert state(pickle.loads(pickle.dumps(config))) == held, "pickled (a spawned worker)"
        assert pickle.loads(pickle.dumps(config)) == config
        if case["transfer"] == "merge":
            carried = pickle.loads(pickle.dumps(MergeSource(config))).config
            assert state(carried) == held, "inside the merge's source (DALI's pool)"
    stage = resolved.workers[0].stage
    assert stage.mapped == case["mapped"] and (stage.bucket_by is not None) == case["bucketing"]
    assert (len(resolved.packing.stream_starts) > 1) == case["mix"]


@pytest.mark.parametrize("case", REFUSED, ids=lambda g: "-".join(map(str, g.values())))
def test_the_modes_left_out_are_refused(datasets, case):
    with pytest.raises(ConfigError):
        options(datasets, **case)
