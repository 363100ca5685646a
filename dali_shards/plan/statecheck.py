"""Is a resume state well formed, and was it saved for this dataset? Pure, no DALI.

A dataset is identified by its shards in order: their *names* (each URL without the longest
directory prefix all the shards share, so that a dataset copied to another folder, machine or
bucket still resumes), their sample counts and, where known, their byte sizes. The state stores
short hashes of each (a few dozen bytes, whatever the number of shards), so that a refusal can say
what differs: the order, the shards themselves, their counts or their sizes. States saved before
names were recorded carry only the hash of the counts: they are accepted with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import numbers
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, TypedDict

import numpy as np

from dali_shards.errors import ConfigError
from dali_shards.options import MAX_EPOCH, LastBatch
from dali_shards.plan.sizes import ShardSizes

log = logging.getLogger("dali_shards")
STATE_FORMAT = "dali-shards-state"
LAYOUT_KEYS = (
    "world_size", "num_workers", "batch_size", "last_batch", "shuffle_buffer", "shuffle_block", "bucket_window"
)  # as saved
SPEC_NAMES = {"num_workers": "py_num_workers"}  # a saved key -> the spec's field (states keep their format)
COUNT_GROUPS = 32  # per-shard counts are hashed in up to this many groups of consecutive shards
GROUP_DIGEST = 4  # hex characters per group
# bounds no real run reaches; a state beyond them is refused before anything is planned for it
MAX_INDEX = 1 << 62  # no dataset holds more samples
MAX_STATE = {"world_size": 1 << 20, "num_workers": 1 << 12, "batch_size": 1 << 24, "history": 1 << 10, "excluded": 1 << 20}


class DatasetRecord(TypedDict):
    """A state's ``dataset``: what identifies the shards (see ``DatasetId.record``)."""

    shards: int
    samples: int
    fingerprint: str
    names: str
    name_set: str
    bytes: Optional[str]
    count_groups: str


class LayoutRecord(TypedDict):
    """One stretch of an epoch in a state's ``history``: the layout that ran it, and its steps."""

    world_size: int
    num_workers: int
    batch_size: int
    last_batch: str
    shuffle_buffer: int
    shuffle_block: int
    bucket_window: int
    steps: int


class _StateFields(TypedDict):
    """The fields every state has (see ``State``)."""

    format: str
    plan_version: int
    dataset: DatasetRecord
    seed: int
    shuffle: bool
    epoch: int
    history: List[LayoutRecord]
    mixture: Optional[str]  # a mix: the digest of its streams' bounds, draws and batching (None: one dataset)


class State(_StateFields, total=False):
    """``DALIShardedIterator.state_dict()``: plain JSON, the same on every rank but for ``excluded``."""

    excluded: List[int]  # the __index__ of samples this rank's DALI operators failed on (on_error="skip")


_FIX = "resume with the shards the state was saved for, listed in the same order"


def digest(value: Any) -> str:
    """A short stable hash of a JSON-able value."""
    return hashlib.sha1(json.dumps(value, separators=(",", ":")).encode("utf-8", "surrogateescape")).hexdigest()[:16]


def relative_names(urls: Sequence[str]) -> Sequence[str]:
    """The URLs without the longest directory prefix they all share (of a catalog's URLs, which say
    that prefix themselves: a sequence that makes each name when it is read)."""
    common = getattr(urls, "common_prefix", None)
    if common is not None:
        return CutNames(urls, common().rfind("/") + 1)
    cut = os.path.commonprefix(list(urls)).rfind("/") + 1 if urls else 0
    return tuple(u[cut:] for u in urls)


class CutNames(Sequence[str]):
    """``urls`` without their first ``cut`` characters, equal to the tuple of them."""

    def __init__(self, urls: Sequence[str], cut: int):
        self.urls, self.cut = urls, cut

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: Any) -> Any:
        return [u[self.cut :] for u in self.urls[i]] if isinstance(i, slice) else self.urls[i][self.cut :]

    def __iter__(self) -> Iterator[str]:
        return (u[self.cut :] for u in self.urls)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (tuple, list, CutNames)) and len(other) == len(self) and tuple(other) == tuple(self)

    def __hash__(self) -> int:
        return hash(tuple(self))


@dataclass(frozen=True)
class DatasetId:
    """What identifies a dataset in a resume state: shard names (relative), counts, byte sizes."""

    names: Sequence[str]
    counts: Sequence[int]
    byte_sizes: Sequence[Optional[int]] = ()

    @classmethod
    def of(cls, urls: Sequence[str], counts: Sequence[int], byte_sizes: Sequence[Optional[int]] = ()) -> "DatasetId":
        """The dataset of these shards (a catalog's views are kept as they are, read when a state is
        made or checked)."""
        sizes = byte_sizes if hasattr(byte_sizes, "catalog") else tuple(byte_sizes)
        return cls(relative_names(urls), ShardSizes(np.asarray(counts, dtype=np.int64)), sizes)

    def record(self) -> DatasetRecord:
        """The ``dataset`` entry of a state."""
        return dict(self._record)  # type: ignore[return-value]

    @cached_property
    def _record(self) -> DatasetRecord:
        known = bool(len(self.byte_sizes)) and all(b is not None for b in self.byte_sizes)
        return {
            "shards": len(self.counts),
            "samples": sum(c for c in self.counts if c > 0),
            "fingerprint": digest(list(self.counts)),
            "names": digest(list(self.names)),
            "name_set": digest(sorted(self.names)),
            "bytes": digest(list(self.byte_sizes)) if known else None,
            "count_groups": "".join(digest(list(g))[:GROUP_DIGEST] for g in self._groups(self.counts)),
        }

    def _groups(self, values: Sequence[Any]) -> List[Sequence[Any]]:
        """``values`` cut into at most ``COUNT_GROUPS`` runs of consecutive shards (equal but the last)."""
        size = -(-len(values) // COUNT_GROUPS) or 1
        return [values[i : i + size] for i in range(0, len(values), size)]

    def changed_shards(self, recorded: Mapping[str, Any]) -> Optional[str]:
        """The shards (or runs of shards) whose counts differ from ``recorded``'s, or None where the
        state does not say (saved before per-group digests were recorded)."""
        theirs = recorded.get("count_groups")
        groups = self._groups(list(zip(self.names, self.counts)))
        if not isinstance(theirs, str) or len(theirs) != GROUP_DIGEST * len(groups):
            return None
        mine = [digest([c for _, c in g])[:GROUP_DIGEST] for g in groups]
        changed = [g for i, g in enumerate(groups) if theirs[i * GROUP_DIGEST : (i + 1) * GROUP_DIGEST] != mine[i]]
        said = [f"{g[0][0]} (now {g[0][1]} samples)" if len(g) == 1 else f"one of {g[0][0]} .. {g[-1][0]}" for g in changed]
        return ", ".join(said[:8]) + (f" and {len(said) - 8} more" if len(said) > 8 else "")

    def check(self, recorded: Mapping[str, Any]) -> None:
        """ConfigError saying what differs unless ``recorded`` (a state's ``dataset``) is this one."""
        mine = self.record()
        here = f"{mine['samples']} samples in {mine['shards']} shards"
        there = f"{recorded.get('samples')} samples in {recorded.get('shards')} shards"
        if recorded.get("names") is None:  # saved before names were recorded: counts only
            if recorded.get("fingerprint") != mine["fingerprint"]:
                raise ConfigError(f"the state was saved for another dataset ({there}) than this pipeline reads ({here}); {_FIX}")
            log.warning("dali_shards: the resume state records shard counts only, not names: order not checked")
            return
        if recorded["names"] != mine["names"]:
            what = "the same shards in another order" if recorded.get("name_set") == mine["name_set"] else "other shards"
            raise ConfigError(f"the state was saved for {what} ({there}; this pipeline reads {here}); {_FIX}")
        if recorded.get("shards", mine["shards"]) != mine["shards"]:
            raise ConfigError(
                f"malformed state: dataset.shards is {recorded.get('shards')}, but it names the {mine['shards']} shards "
                "this pipeline reads"
            )
        if recorded.get("fingerprint") != mine["fingerprint"]:
            changed = self.changed_shards(recorded)
            totals = f"the same {here}" if recorded.get("samples") == mine["samples"] else f"{there}, now {here}"
            raise ConfigError(
                f"the shards changed since the state was saved: their sample counts differ ({totals}"
                + (f"; changed: {changed}" if changed else "")
                + "); the rest of that epoch cannot be told apart: start the epoch again (start_epoch=...)"
            )
        if recorded.get("samples", mine["samples"]) != mine["samples"]:
            raise ConfigError(
                f"malformed state: dataset.samples is {recorded.get('samples')}, but the shard counts it fingerprints "
                f"sum to {mine['samples']}"
            )
        if recorded.get("bytes") and mine["bytes"] and recorded["bytes"] != mine["bytes"]:
            raise ConfigError(
                "the shards changed since the state was saved: same names and counts, other byte sizes; "
                "their samples may differ: start the epoch again (start_epoch=...)"
            )


def check_state_shape(state: Any) -> Dict[str, Any]:
    """The state, if every field has the right type and range; else a ConfigError naming it."""
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ConfigError("not a dali_shards state (expected the dict from DALIShardedIterator.state_dict())")
    _want(state, "plan_version", _is_int, "an integer")
    _want(state, "epoch", lambda v: _is_int(v) and 0 <= v <= MAX_EPOCH, f"an integer in 0..{MAX_EPOCH}")
    _want(state, "seed", _is_int, "an integer")
    _want(state, "shuffle", lambda v: isinstance(v, bool), "true or false")
    _want(state, "dataset", lambda v: isinstance(v, Mapping), "an object")
    _want(state["dataset"], "fingerprint", lambda v: isinstance(v, str), "a string", "dataset.")
    for key in ("shards", "samples"):
        if key in state["dataset"]:
            _want(state["dataset"], key, lambda v: _is_int(v) and v >= 0, "an integer >= 0", "dataset.")
    limit = MAX_STATE["history"]
    _want(state, "history", lambda v: isinstance(v, list) and len(v) <= limit, f"a list of at most {limit} layouts")
    history = []
    for i, entry in enumerate(state["history"]):
        where = f"history[{i}]."
        if not isinstance(entry, Mapping):
            raise ConfigError(f"malformed state: history[{i}] must be an object, got {entry!r}")
        entry = {"bucket_window": 0, **entry}  # states saved before bucketing existed: none
        history.append(entry)
        for key in ("world_size", "num_workers", "batch_size"):
            top = MAX_STATE[key]
            _want(entry, key, lambda v, top=top: _is_int(v) and 1 <= v <= top, f"an integer in 1..{top}", where)
        _want(entry, "shuffle_buffer", lambda v: _is_int(v) and v >= 1, "an integer >= 1", where)
        _want(entry, "shuffle_block", lambda v: _is_int(v) and v >= 0, "an integer >= 0", where)
        _want(entry, "bucket_window", lambda v: _is_int(v) and v >= 0, "an integer >= 0", where)
        _want(entry, "last_batch", lambda v: isinstance(v, str) and v in {m.value for m in LastBatch}, "'pad' or 'drop'", where)
        _want(entry, "steps", lambda v: _is_int(v) and v >= 0, "an integer >= 0", where)
        if entry["batch_size"] % entry["num_workers"]:
            raise ConfigError(f"malformed state: {where}batch_size is not a multiple of {where}num_workers")
    if "stand_in" in state:  # (only in the states a rebuild after a skip passes on)
        samples = state["dataset"].get("samples", MAX_INDEX)
        _want(state, "stand_in", lambda v: _is_int(v) and 0 <= v < samples, f"a sample index in 0..{samples - 1}")
    if "excluded" in state:
        top, samples = MAX_STATE["excluded"], state["dataset"].get("samples", MAX_INDEX)
        _want(state, "excluded", lambda v: isinstance(v, list) and len(v) <= top and all(_is_int(i) and 0 <= i < samples for i in v),
              f"a list of at most {top} sample indices in 0..{samples - 1}")  # fmt: skip
    return {**state, "history": history}


def merge_rank_states(states: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The ``state_dict()`` of each rank of one run, saved at one step, as one state that resumes the
    run under any layout: each rank's ``excluded`` samples joined; a ConfigError if they differ in
    anything else (states of other runs or steps)."""
    if not states:
        raise ConfigError("no state to resume from: the checkpoint holds no rank's state")
    common = [{k: v for k, v in s.items() if k != "excluded"} for s in states]
    odd = next((i for i, c in enumerate(common) if c != common[0]), None)
    if odd is not None:
        raise ConfigError(
            f"the states of rank 0 and rank {odd} differ (epoch {common[0].get('epoch')} and {common[odd].get('epoch')}, "
            f"{sum(e.get('steps', 0) for e in common[0].get('history', []))} and "
            f"{sum(e.get('steps', 0) for e in common[odd].get('history', []))} steps): they were not saved at one step of "
            "one run; restore a checkpoint that every rank saved at the same step"
        )
    excluded = sorted({int(i) for s in states for i in s.get("excluded", ())})
    return {**common[0], "excluded": excluded} if excluded else dict(common[0])


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _want(obj: Mapping[str, Any], key: str, ok, what: str, where: str = "") -> None:
    if key not in obj:
        raise ConfigError(f"malformed state: {where}{key} is missing (a dali_shards state_dict() has it)")
    if not ok(obj[key]):
        got = repr(obj[key])
        raise ConfigError(f"malformed state: {where}{key} must be {what}, got {got[:200]}{'...' if len(got) > 200 else ''}")
