"""Each transfer's decisions, without DALI: ``options.transfer`` read in one place, then the
transfer object asked for its slot layout, its checks of the DALI keywords, the keywords it adds,
its queues (one rule for ``prefetch_queue_depth``) and its slots' size."""

import ast
import os

import pytest

import dali_shards
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.errors import ConfigError
from dali_shards.options import ShardedOptions
from dali_shards.setup.resolve import MAX_SAMPLE_BYTES, field_sizes, resolve
from dali_shards.ipc.packing import Packing
from dali_shards.transfer.base import Queues, steps_held
from dali_shards.transfer.choice import transfer_for
from dali_shards.transfer.merge.transfer import SLOT_META_BYTES, MergeTransfer
from dali_shards.transfer.ring.transfer import RingTransfer
from dali_shards.worker.codec import SampleCodec

ROOT = os.path.dirname(dali_shards.__file__)
DEFAULTS = {"prefetch_queue_depth": 2, "py_start_method": "fork", "exec_pipelined": True}  # DALI's


def options(source=("a.tar",), transfer="ring", workers=2, **kw):
    base = dict(source=list(source), fields=("json", "jpg", "cls"), batch_size=4 * workers, py_num_workers=workers,
                transfer=transfer, world_size=1, rank=0)  # fmt: skip
    return ShardedOptions.from_keywords(**{**base, **kw})


def choose_packing(fields, shards, workers, transfer):
    """The slot format the transfer chooses for ``fields`` of these shards."""
    layout = transfer_for(options(transfer=transfer, workers=workers, fields=fields))
    table, payload = layout.slot_layout(lambda: field_sizes(shards, SampleCodec(fields)))
    return Packing(fields, table=table, payload=payload)


def test_layout_choice():
    shards = [ShardInfo("a.tar", 10, 10**6, {"jpg": 900000, "cls": 20, "json": 5000})]
    for workers in (1, 2):  # the ring: a table of every field, whatever the workers
        ring = choose_packing(("json", "jpg", "cls"), shards, workers, transfer="ring")
        assert ring.table and ring.payload is None
    merge = lambda fields, shards, n: choose_packing(fields, shards, n, transfer="merge")  # noqa: E731
    assert not merge(("json", "jpg", "cls"), shards, 1).table
    assert merge(("json", "jpg", "cls"), shards, 2).payload == "jpg"
    assert merge(("cls", "__key__"), shards, 4).payload is None
    legacy = [ShardInfo("a.tar", 10, 10**6)]  # no per-extension sizes: the first byte field
    assert merge(("json", "jpg", "cls"), legacy, 2).payload == "json"


def test_a_step_is_held_for_dalis_queue_or_both_queues_where_they_differ():
    assert [steps_held(q) for q in (1, 2, 5)] == [1, 2, 5]
    assert steps_held({"cpu_size": 3, "gpu_size": 3}) == 3
    assert steps_held({"cpu_size": 2, "gpu_size": 3}) == 6
    assert steps_held({"cpu": 1, "gpu": 4}) == 4  # (the keys DALI itself writes once built)
    assert steps_held({}) == 1  # (DALI refuses it, in its words)


def test_the_option_makes_the_transfer_object():
    ring, merge = transfer_for(options()), transfer_for(options(transfer="merge"))
    assert isinstance(ring, RingTransfer) and isinstance(merge, MergeTransfer)
    assert transfer_for(options()) is not ring, "one object per pipeline"
    assert ring.pipeline_keywords() == {}, "no pool of DALI's"
    assert merge.pipeline_keywords() == {"py_num_workers": 2}


def test_options_transfer_is_read_in_one_place():
    """``options.transfer`` (and the ``Transfer`` enum's members) appear in ``transfer/choice.py``
    only, besides ``options.py`` that defines them."""
    readers = set()
    for folder, _, files in os.walk(ROOT):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or os.path.relpath(path, ROOT) == "options.py":
                continue
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (
                    (node.attr == "transfer" and "option" in node.value.id) or node.value.id == "Transfer"
                ):
                    readers.add(os.path.relpath(path, ROOT))
    assert readers == {os.path.join("transfer", "choice.py")}


@pytest.mark.parametrize("transfer, settings, what", [
    ("ring", {"py_start_method": "forkserver"}, "py_start_method='forkserver'"),
    ("ring", {"prefetch_queue_depth": None}, "prefetch_queue_depth=None"),
    ("ring", {"prefetch_queue_depth": {"cpu_size": 2, "gpu_size": 0}}, "prefetch_queue_depth="),
    ("merge", {"prefetch_queue_depth": {"cpu_size": 2, "gpu_size": 3}}, "prefetch_queue_depth="),
    ("merge", {"prefetch_queue_depth": 0}, "prefetch_queue_depth=0"),
    ("merge", {"exec_pipelined": False}, "exec_pipelined=False"),
])  # fmt: skip
def test_each_transfer_checks_the_dali_keywords_it_cannot_run_with(transfer, settings, what):
    transfer_for(options(transfer=transfer)).check(DEFAULTS)
    with pytest.raises(ConfigError, match=what.replace("(", "\\(")):
        transfer_for(options(transfer=transfer)).check({**DEFAULTS, **settings})


@pytest.mark.parametrize("transfer", ["ring", "merge"])
@pytest.mark.parametrize("depth, held", [(2, 2), (5, 5), ({"cpu_size": 2, "gpu_size": 3}, 6)])
def test_queues_and_slots_follow_one_rule(make_shards, transfer, depth, held):
    if transfer == "merge" and isinstance(depth, dict):
        return  # (refused: see the checks)
    paths = make_shards((6, 6))
    opts = options(paths, transfer=transfer, fields=("jpg", "cls"), worker_prefetch=3)
    handover = transfer_for(opts)
    resolved = resolve(opts, transfer=handover)
    handover.start(resolved.workers, 1000, None, {**DEFAULTS, "prefetch_queue_depth": depth})
    assert handover.queues == Queues(held, 3)
    assert handover.in_flight() == held + 3 + 1, "DALI's held steps, each worker's own queue, the one it makes"
    if transfer == "ring":
        assert handover.workers.depth == held + 3 and handover.workers.direct
        assert handover.workers.first_slot_bytes == 1000 * 4, "a mini-batch of samples"
    else:
        assert handover.hint == 1000 // 2 + SLOT_META_BYTES, "a place of a worker's batch holds 1/workers sample"
        assert len(handover.sources) == 2


def test_a_samples_bytes_are_estimated_once_and_bounded(make_shards):
    paths = make_shards((6, 6))
    resolved = resolve(options(paths, fields=("jpg", "cls")))
    assert 0 < resolved.sample_bytes <= MAX_SAMPLE_BYTES
