"""Where an epoch stands, as a small JSON-able state, and how to continue from it.

The plan is a pure function, so a position in an epoch is just: the epoch, and the layouts it ran
under (world size, workers, batch size, ...) with the steps taken under each. No buffers, no
sample lists. The state is the same on every rank (all ranks take the same steps)::

    {"format": "dali-shards-state", "plan_version": 4,
     "dataset": {"shards": 128, "samples": 1281167, "fingerprint": "3f1c...", "names": "9e02...",
                 "name_set": "77ab...", "bytes": "c4d1..."},
     "seed": 42, "shuffle": true, "epoch": 7,
     "history": [{"world_size": 8, "num_workers": 4, "batch_size": 256, "last_batch": "pad",
                  "shuffle_buffer": 1024, "shuffle_block": 256, "bucket_window": 0, "steps": 311}]}

The ``dataset`` entry identifies the shards (see ``statecheck``); a state is checked field by field
before it is used. Resuming under the same layout continues every worker's order where it stopped (the epoch comes out
as if never interrupted); under another layout the samples not yet delivered are planned anew over
the new ranks and workers, and later epochs follow the new layout. An epoch in progress goes on
under the plan version it was saved with (``RESUMABLE_PLAN_VERSIONS``); the epochs after it follow
this release's ``PLAN_VERSION``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union, cast

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.plan import multiset
from dali_shards.plan.epoch import PLAN_VERSION, RESUMABLE_PLAN_VERSIONS, EpochPlan, Lengths, PlanSpec
from dali_shards.plan.legacy import LEGACY_VERSIONS, LegacyPlan
from dali_shards.plan.units import Units
from dali_shards.plan.statecheck import digest
from dali_shards.plan.statecheck import LAYOUT_KEYS, SPEC_NAMES, STATE_FORMAT, DatasetId, LayoutRecord, State, check_state_shape


Plan = Union[EpochPlan, LegacyPlan]  # an epoch's plan: this release's, or an older version's to finish an epoch


def plan_of(spec: PlanSpec, epoch: int, subset: Any = None, start_step: int = 0, version: int = PLAN_VERSION) -> Plan:
    """The plan of ``epoch`` under plan ``version`` (an older one only to finish an epoch saved
    under it): of the whole dataset, or of ``subset`` (what was left of it: ``Units``, or sorted
    sequence positions for the older versions)."""
    if version in LEGACY_VERSIONS:
        return LegacyPlan(spec, epoch, cast(Optional[np.ndarray], subset), start_step=start_step, version=version)
    return spec.epoch(epoch, subset=cast(Optional[Units], subset), start_step=start_step, version=version)


def layout_of(spec: PlanSpec) -> Dict[str, Any]:
    """The spec's layout as a state records it."""
    values = {k: getattr(spec, SPEC_NAMES.get(k, k)) for k in LAYOUT_KEYS}
    return {**values, "last_batch": values["last_batch"].value}


def epoch_plan(spec: PlanSpec, resumed: Optional[Plan], epoch: int) -> Plan:
    """The plan of ``epoch``: ``resumed`` (the rest of the epoch a pipeline resumes in) where it is
    that epoch's, else the spec's."""
    if resumed is not None and resumed.epoch == epoch:
        return resumed
    return spec.epoch(epoch)


def make_state(
    spec: PlanSpec,
    epoch: int,
    prior: List[Dict[str, Any]],
    plan: Plan,
    steps: int,
    dataset: Optional[DatasetId] = None,
    excluded: Sequence[int] = (),
) -> State:
    """The state after ``steps`` batches of ``plan`` (counted from the plan's step 0), the plan
    running in ``epoch`` after the ``prior`` layouts of that epoch. At the end of an epoch the
    state is the start of the next one. ``dataset`` identifies the shards (default: by the plan's
    shard sizes alone, unnamed); ``excluded``, the samples DALI's operators failed on (kept for the
    rest of the run)."""
    history: List[LayoutRecord]
    if steps >= plan.steps:
        epoch, history = epoch + 1, []
    elif steps == 0 and not prior and plan.subset is None:
        history = []  # the start of a fresh epoch
    else:
        history = cast(List[LayoutRecord], [*prior, {**layout_of(spec), "steps": int(steps)}])
    state: State = {
        "format": STATE_FORMAT,
        "plan_version": plan.version if history else PLAN_VERSION,
        "dataset": (dataset or _unnamed(spec)).record(),
        "seed": spec.seed,
        "shuffle": spec.shuffle,
        "epoch": int(epoch),
        "history": history,
        "mixture": mixture_digest(spec),
    }
    if excluded:
        state["excluded"] = sorted(int(i) for i in excluded)
    return state


def mixture_digest(spec: PlanSpec) -> Optional[str]:
    """What identifies a mix in a state (None: one dataset)."""
    mix = spec.mixture
    return None if mix is None else digest([list(mix.bounds), list(mix.counts), mix.batching.value])


def _unnamed(spec: PlanSpec) -> DatasetId:
    return DatasetId(tuple(str(i) for i in range(len(spec.shard_sizes))), spec.shard_sizes)


def _check(spec: PlanSpec, state: Dict[str, Any], dataset: Optional[DatasetId]) -> Dict[str, Any]:
    """``state`` checked against this pipeline, with the defaults of keys older states lack."""
    state = check_state_shape(state)
    if state["plan_version"] not in RESUMABLE_PLAN_VERSIONS:
        raise ConfigError(
            f"the state was saved with plan version {state['plan_version']}, this dali_shards plans with "
            f"version {PLAN_VERSION} and resumes states of versions {RESUMABLE_PLAN_VERSIONS}; resume with the "
            "dali_shards version that saved it"
        )
    (dataset or _unnamed(spec)).check(state["dataset"])
    if state.get("mixture") != mixture_digest(spec):
        raise ConfigError(
            "the state was saved for another mix of streams (or for one dataset, or a mix: not the same) than this "
            "pipeline reads: resume with the same streams, in the same order, with the same counts and batching"
        )
    if state["seed"] != spec.seed or state["shuffle"] != spec.shuffle:
        raise ConfigError(
            f"the state was saved with seed={state['seed']}, shuffle={state['shuffle']}; this pipeline "
            f"has seed={spec.seed}, shuffle={spec.shuffle}: resume with the same seed and shuffle"
        )
    return state


def resume_point(
    spec: PlanSpec, state: Dict[str, Any], dataset: Optional[DatasetId] = None, lengths: Optional[Lengths] = None
) -> Tuple[int, Optional[Plan], List[Dict[str, Any]]]:
    """Where a pipeline with ``spec`` over ``dataset`` resumes ``state``: the epoch to start at,
    the plan for that epoch (None for a plain start of it), and the layouts that already ran in
    that epoch. A malformed state, or one saved for other shards or settings, is a ConfigError.
    ``lengths`` reads samples' lengths for bucketed layouts stopped inside a window (see
    ``EpochPlan.consumed``)."""
    state = _check(spec, state, dataset)
    epoch, version = int(state["epoch"]), int(state["plan_version"])  # the epoch goes on under its version
    history = list(state.get("history", []))
    if not history:
        return epoch, None, []
    subset = None
    for i, layout, past, steps in _layouts(spec, history, epoch, version, lengths):
        if i == len(history) - 1 and layout == layout_of(spec):
            return epoch, plan_of(spec, epoch, past.subset, start_step=steps, version=version), history[:-1]
        subset = (past, steps)
    assert subset is not None  # the history is not empty
    plan = plan_of(spec, epoch, subset[0].remaining(subset[1], lengths), version=version)
    if plan.steps == 0:  # too few samples left for a whole batch ("drop")
        return epoch + 1, None, []
    return epoch, plan, history


def draws_left(
    spec: PlanSpec, state: Dict[str, Any], dataset: Optional[DatasetId] = None, lengths: Optional[Lengths] = None
) -> Optional[np.ndarray]:
    """The draws (``__index__``, a sample as many times as drawn) of the epoch ``state`` stopped in
    that its layouts have not delivered: the epoch's plan under its first layout, less what each
    layout delivered. Found without the re-planning of what is left (``progress``), which it
    checks (the audit). None for a fresh epoch's state, or an older plan version's."""
    state = _check(spec, state, dataset)
    epoch, version = int(state["epoch"]), int(state["plan_version"])
    history = list(state.get("history", []))
    if not history or version in LEGACY_VERSIONS:
        return None
    delivered, draws = [], np.zeros(0, np.int64)
    for i, _, past, steps in _layouts(spec, history, epoch, version, lengths):
        if i == 0:
            assert isinstance(past, EpochPlan)  # not a legacy version (above)
            draws = past.units.positions(past.canonical_starts)
        delivered.append(past.consumed(steps, lengths))
    return multiset.difference(draws, np.concatenate(delivered))


def _layouts(
    spec: PlanSpec, history: List[Dict[str, Any]], epoch: int, version: int, lengths: Optional[Lengths]
) -> Iterator[Tuple[int, Dict[str, Any], Plan, int]]:
    """Each layout of ``history`` with its plan of ``epoch`` (of what the layouts before it left)
    and the steps it took."""
    subset = None
    for i, entry in enumerate(history):
        layout = {k: entry[k] for k in LAYOUT_KEYS}
        steps = int(entry["steps"])
        fields = {SPEC_NAMES.get(k, k): v for k, v in layout.items()}
        past_spec = PlanSpec(spec.shard_sizes, seed=spec.seed, shuffle=spec.shuffle, mixture=spec.mixture, **fields)
        past = plan_of(past_spec, epoch, subset, version=version)
        if steps >= past.steps:  # make_state starts the next epoch instead: no run saves this
            raise ConfigError(
                f"malformed state: history[{i}] says {steps} steps were taken under world_size="
                f"{entry['world_size']}, num_workers={entry['num_workers']}, batch_size={entry['batch_size']}, "
                f"whose plan of epoch {epoch} {'there ' if i else ''}has {past.steps}: the state was not saved "
                "by a run over these shards; resume from the state_dict() the run saved"
            )
        yield i, layout, past, steps
        if i < len(history) - 1:
            subset = past.remaining(steps, lengths)
