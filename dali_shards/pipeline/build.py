"""From a resolved pipeline to a DALI one: the transfer's inputs (``dali_shards.transfer``), the
user's graph function, the pipeline and its supervision."""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
from nvidia.dali.pipeline import Pipeline

from dali_shards.errors import ConfigError
from dali_shards.options import ShardedOptions, Transfer
from dali_shards.pipeline.conditionals import define_pipeline
from dali_shards.setup.info import ShardedPipelineInfo
from dali_shards.setup.first_sample import check_graph_call, output_names
from dali_shards.setup.resolve import Resolved, resolve
from dali_shards.supervise import supervise
from dali_shards.plan.random import MASK64
from dali_shards.shm.control import ControlBlock
from dali_shards.fields import KEY, FieldKind
from dali_shards.shm.packed import FieldSpec
from dali_shards.transfer.merge.transfer import MergeTransfer
from dali_shards.transfer.ring.transfer import RingTransfer
from dali_shards.device import check_start_method, default_device_id
from dali_shards.pipeline.probe import Probe

_TAG_PIPELINE_SEED = 0x4155_4720
DEFAULT_NUM_THREADS = max(1, min(4, os.cpu_count() or 1))  # DALI's CPU threads when num_threads is not given
DALI_QUEUE_DEPTH = inspect.signature(Pipeline.__init__).parameters["prefetch_queue_depth"].default  # DALI's own default


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
    start_method = pipeline_kwargs.get("py_start_method", "fork")
    if options.transfer is Transfer.MERGE:  # DALI's pool cannot fork once CUDA is initialised; our workers can
        check_start_method(start_method)
        check_merge_queue(pipeline_kwargs.get("prefetch_queue_depth"))
        check_merge_executor(pipeline_kwargs)
    control = ControlBlock.create(
        options.py_num_workers, worker_prefetch=options.worker_prefetch, worker_timeout=options.worker_timeout
    )
    outputs = output_names(func, fn_args, fn_kwargs) if options.map is not None else ()
    resolved = resolve(options, outputs).with_control(control.path)
    queue = pipeline_kwargs.get("prefetch_queue_depth", DALI_QUEUE_DEPTH)
    transfer = make_transfer(resolved, start_method, control, queue)
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

    kwargs: Dict[str, Any] = {
        "batch_size": options.batch_size,
        "seed": pipeline_seed(options.seed, resolved.rank, resolved.start_epoch, resolved.steps_before),
    }
    if options.transfer is Transfer.MERGE:
        kwargs["py_num_workers"] = options.py_num_workers
    if "device_id" not in pipeline_kwargs:
        kwargs["device_id"] = default_device_id()
    if pipeline_kwargs.get("num_threads") is None:  # DALI has no default: it would fail when built
        kwargs["num_threads"] = DEFAULT_NUM_THREADS
    kwargs.update(pipeline_kwargs)
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


def check_merge_queue(depth: Any) -> None:
    """A ConfigError unless DALI's worker pool can take ``prefetch_queue_depth`` (one int)."""
    if depth is None or (isinstance(depth, (int, np.integer)) and not isinstance(depth, bool) and depth >= 1):
        return
    raise ConfigError(
        f"prefetch_queue_depth={depth!r} with transfer='merge': DALI's worker pool takes one positive "
        "integer (separate CPU and GPU queues are not supported with parallel external sources); give an "
        "integer, or use transfer='ring', which takes both"
    )


def check_merge_executor(pipeline_kwargs: Dict[str, Any]) -> None:
    """A ConfigError where DALI's parallel external sources would never be given a task: they are
    first scheduled when a pipelined pipeline prefetches (``exec_pipelined=False``: never)."""
    if pipeline_kwargs.get("exec_pipelined", True):
        return
    given = ", ".join(f"{k}={pipeline_kwargs[k]!r}" for k in ("exec_async", "exec_pipelined") if k in pipeline_kwargs)
    raise ConfigError(
        f"{given} with transfer='merge': DALI schedules its parallel external sources (the merge's workers) "
        "only in a pipelined executor, so the first step would fail in DALI ('No task has been scheduled'); "
        "leave exec_pipelined at True, or use transfer='ring', which runs under either executor"
    )


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


def make_transfer(resolved: Resolved, start_method: str, control: Optional[ControlBlock],
                  prefetch_queue_depth: Any) -> Any:  # fmt: skip
    """The pipeline's transfer (``options.transfer``) over the resolved workers, for a pipeline of
    this ``prefetch_queue_depth``."""
    options = resolved.options
    if options.transfer is Transfer.MERGE:
        return MergeTransfer(resolved.workers, resolved.packing, batch_size=options.batch_size,
                             worker_prefetch=options.worker_prefetch, bytes_per_sample_hint=resolved.bytes_per_sample_hint)  # fmt: skip
    per_sample = (resolved.bytes_per_sample_hint or 0) * options.py_num_workers  # (the hint is per merge slot)
    first_slot = per_sample * (options.batch_size // options.py_num_workers)
    return RingTransfer(resolved.workers, resolved.packing, batch_size=options.batch_size,
                        worker_prefetch=options.worker_prefetch, start_method=start_method,
                        start_epoch=resolved.start_epoch, first_slot_bytes=first_slot, control=control,
                        prefetch_queue_depth=prefetch_queue_depth)  # fmt: skip
