"""From the options to a DALI pipeline: the transfer (``dali_shards.transfer``: made once, then
asked), the resolved workers, the transfer's inputs, the user's graph function, the pipeline and its
supervision."""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Dict, Mapping, Sequence, Tuple

import numpy as np
from nvidia.dali.pipeline import Pipeline

from dali_shards.options import ShardedOptions
from dali_shards.pipeline.conditionals import define_pipeline
from dali_shards.setup.info import ShardedPipelineInfo
from dali_shards.setup.first_sample import check_graph_call, output_names
from dali_shards.setup.resolve import Resolved, resolve
from dali_shards.supervise import supervise
from dali_shards.plan.random import MASK64
from dali_shards.ipc.control import ControlBlock
from dali_shards.fields import KEY, FieldKind
from dali_shards.ipc.packed import FieldSpec
from dali_shards.transfer.base import Handover
from dali_shards.transfer.choice import transfer_for
from dali_shards.device import default_device_id
from dali_shards.pipeline.probe import Probe

_TAG_PIPELINE_SEED = 0x4155_4720
DEFAULT_NUM_THREADS = max(1, min(4, os.cpu_count() or 1))  # DALI's CPU threads when num_threads is not given
# what a transfer reads of the pipeline's DALI keywords, DALI's own defaults where not given
DALI_DEFAULTS = {name: inspect.signature(Pipeline.__init__).parameters[name].default
                 for name in ("prefetch_queue_depth", "py_start_method", "exec_pipelined")}  # fmt: skip


def pipeline_seed(seed: int, rank: int, epoch: int = 0, step: int = 0) -> int:
    """DALI's seed for random operators: fixed by (seed, rank, the epoch and step the pipeline
    starts at), different on every rank, and for a resumed pipeline different from the start's,
    so that a resumed run draws new augmentations instead of replaying those of step 0."""
    state = np.random.SeedSequence([seed & MASK64, rank, epoch, step, _TAG_PIPELINE_SEED]).generate_state(1)
    return int(state[0] & 0x7FFF_FFFF)


def build_sharded_pipeline(
    func: Callable[..., Any],
    options: ShardedOptions,
    pipeline_kwargs: Dict[str, Any],
    fn_args: Sequence[Any] = (),
    fn_kwargs: Dict[str, Any] | None = None,
) -> Pipeline:
    """Create the pipeline of a ``@sharded_pipeline`` function for the given options."""
    fn_kwargs = dict(fn_kwargs or {})
    if options.map is None:  # (with one, the map's outputs are named after the function's parameters)
        check_graph_call(func, options.fields, fn_args, fn_kwargs)
    settings = {**DALI_DEFAULTS, **pipeline_kwargs}
    transfer = transfer_for(options)
    transfer.check(settings)
    control = ControlBlock.create(options.py_num_workers, worker_timeout=options.worker_timeout)
    outputs = output_names(func, fn_args, fn_kwargs) if options.map is not None else ()
    resolved = resolve(options, outputs, transfer).with_control(control.path)
    transfer.start(resolved.workers, resolved.sample_bytes, control, settings)
    captured: Dict[str, Any] = {}

    def graph():
        fields, slot_status = transfer.graph_inputs()
        result = func(*fields, *fn_args, **fn_kwargs)
        captured["outputs"] = result if isinstance(result, tuple) else (() if result is None else (result,))
        transfer.returned(captured["outputs"])
        captured["slot_status"] = slot_status
        captured["key_outputs"] = key_positions(captured["outputs"], fields, resolved.packing.fields)
        captured["varying_outputs"] = varying_positions(captured["outputs"], fields, resolved.packing.fields)
        return result

    kwargs = dali_keywords(options, resolved, transfer, pipeline_kwargs)
    pipe = define_pipeline(graph, kwargs)
    transfer.attach(pipe)  # its workers start when the pipeline is built
    supervise(pipe, control)  # the control block goes with the pipeline; SIGTERM acts as Ctrl-C

    def rebuild(**overrides: Any) -> Pipeline:
        """The same pipeline, anew, with some options changed (e.g. ``resume_from``)."""
        return build_sharded_pipeline(func, options.replace(**overrides), pipeline_kwargs, fn_args, fn_kwargs)

    pipe.dali_shards = ShardedPipelineInfo(  # type: ignore[attr-defined]  # our attribute on DALI's Pipeline
        resolved=resolved,
        rebuild=rebuild,
        outputs=captured["outputs"],
        slot_status=captured["slot_status"],
        key_outputs=captured["key_outputs"],
        varying_outputs=captured["varying_outputs"],
        control=control,
        transfer=transfer,
        probe=lambda packing: Probe(func, packing, kwargs, fn_args, fn_kwargs),
    )
    return pipe


def dali_keywords(options: ShardedOptions, resolved: Resolved, transfer: Handover,
                  pipeline_kwargs: Mapping[str, Any]) -> Dict[str, Any]:  # fmt: skip
    """The keywords of DALI's ``Pipeline``: the batch, the seed, those the transfer needs, a device
    and CPU threads where not given; the user's ``pipeline_kwargs`` over them."""
    kwargs: Dict[str, Any] = {
        "batch_size": options.batch_size,
        "seed": pipeline_seed(options.seed, resolved.rank, resolved.start_epoch, resolved.steps_before),
        **transfer.pipeline_keywords(),
    }
    if "device_id" not in pipeline_kwargs:
        kwargs["device_id"] = default_device_id()
    if pipeline_kwargs.get("num_threads") is None:  # DALI has no default: it would fail when built
        kwargs["num_threads"] = DEFAULT_NUM_THREADS
    kwargs.update(pipeline_kwargs)
    return kwargs


def key_positions(outputs: Sequence[Any], nodes: Sequence[Any], fields: Sequence[Any]) -> Tuple[int, ...]:
    """The positions of the outputs that are the ``__key__`` field's node itself."""
    return _positions(outputs, [node for node, f in zip(nodes, fields) if f.name == KEY])


def varying_positions(outputs: Sequence[Any], nodes: Sequence[Any], fields: Sequence[FieldSpec]) -> Tuple[int, ...]:
    """The positions of the outputs that are, unchanged, a field of bytes (a member's, or a ``map``'s
    bytes output): samples that differ in length. Arrays (``.npy`` members, a ``map``'s arrays) are
    taken as dense unless declared ragged: fixed-size features are the common case."""
    return _positions(outputs, [node for node, f in zip(nodes, fields) if may_vary(f)])


def may_vary(field: FieldSpec) -> bool:
    """Whether ``field`` is bytes, whose samples differ in length."""
    return field.kind == FieldKind.BYTES or (field.kind == FieldKind.PAYLOAD and field.dtype is None)


def _positions(outputs: Sequence[Any], nodes: Sequence[Any]) -> Tuple[int, ...]:
    return tuple(i for i, out in enumerate(outputs) if any(out is node for node in nodes))
