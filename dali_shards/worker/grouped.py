"""Small steps of the ring's fast path read, located and given their rows together: a batch shared
by many workers leaves each only 16 to 32 samples per step, and a step's NumPy work costs about
the same for 16 samples as for 256, so a group of steps (about ``GROUP_SAMPLES`` samples or
``GROUP_BYTES`` bytes) pays it once. Every step of a group is worked out with one NumPy call per
group, not per step: its samples (each once, in order: padding repeats the last), its layout, its
rows. A worker's groups begin at steps of its own (``stagger.py``), so that the workers of a rank
do not all read a group at the same step; the group that opens an epoch is read ahead, with the
epoch before's last group and after it in the same buffer (``DirectBatches.prepare``,
``GroupBuffers``). Imports no DALI.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from dali_shards.ipc.packed import INDEX_COLUMN, STATUS_PADDING, STATUS_VALID, VALID_COLUMN
from dali_shards.ipc.tables import Grow
from dali_shards.worker.located import NotDirect, aligned, any_excluded, located_fields, read_spans

GROUP_SAMPLES = 256  # a group holds steps until it has this many samples...
GROUP_BYTES = 16 << 20  # ... or this many bytes (at least one step): a worker's memory for groups
GROUPED_SAMPLE_BYTES = 256 << 10  # larger samples are read straight into the slot (their step's fixed cost is small beside them)


def group_steps(mini_batch: int) -> int:
    """The steps of ``mini_batch`` samples a group holds at most (``GROUP_SAMPLES``)."""
    return -(-GROUP_SAMPLES // max(1, mini_batch))


class GroupBuffers:
    """A worker's buffer for its groups' bytes, kept across epochs (a buffer's first touch costs):
    room for a group of ``GROUP_BYTES`` or more reserved at once (only the pages a group touches
    take memory), grown with room to spare where a group needs more. A group is laid out from its
    start: when one is made, every group before it has been handed on. The group that opens the next
    epoch (``ahead``) is read with the current epoch's last group, the two together one group's
    steps: it goes after that group, where the buffer has room; else into a spare buffer, and the
    buffer grows to hold both when the next group is made (the spare then goes)."""

    def __init__(self) -> None:
        self.buffer = np.empty(0, dtype=np.uint8)
        self.used = 0  # bytes of the buffer the current group holds
        self.want = 0  # bytes the buffer should hold: the current group and the opening group together
        self.spare: Optional[np.ndarray] = None

    def get(self, size: int, ahead: bool = False) -> np.ndarray:
        """Room for ``size`` bytes: for the next group, or (``ahead``) for the next epoch's opening
        group, beside the current one."""
        if ahead:
            at = int(aligned(self.used))
            if at + size <= len(self.buffer):
                return self.buffer[at:]
            self.want = max(self.want, at + size)
            if self.spare is None or len(self.spare) < size:
                self.spare = np.empty(size + size // 4, dtype=np.uint8)
            return self.spare
        need = max(size, self.want)
        if len(self.buffer) < need:  # (the groups it held are handed on; a spare in use is kept by its group)
            room = max(need + need // 4, GROUP_BYTES + GROUP_BYTES // 4)
            self.buffer, self.spare = np.empty(room, dtype=np.uint8), None
        self.used = size
        return self.buffer


def first_seen(places: np.ndarray) -> tuple:
    """Of ``places`` (steps × samples), each step's distinct samples in the order they first occur
    there, one step after another (``unique``), how many each step has (``counts``), and where
    each sample of each step is in ``unique`` (``which``, flat)."""
    steps, m = places.shape
    keys = np.arange(steps, dtype=np.int64)[:, None] * (int(places.max(initial=0)) + 1) + places
    _, first, inverse = np.unique(keys.reshape(-1), return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # the distinct keys in the order they occur
    rank = np.empty(len(first), dtype=np.int64)
    rank[order] = np.arange(len(first))
    flat = places.reshape(-1)
    return flat[first[order]], np.bincount(first[order] // m, minlength=steps), rank[inverse.reshape(-1)]


class StepGroup:
    """Steps ``[first, end)`` of an epoch (``DirectBatches``; ``end`` at most ``stop``) read into one
    buffer (``ahead``: the group that opens an epoch, read beside the epoch before's last), each step's
    samples laid out as in its slot (block-aligned, one after another), located at once
    (``located.locate``), and each step's header rows made: a step then costs one copy of its bytes
    and of its rows into its slot (``GroupedStep``). ``ok`` is False where anything in the group is
    out of the ordinary: its steps then go one by one (``DirectStep``)."""

    def __init__(self, epoch: Any, first: int, stop: int, ahead: bool = False):
        self.epoch, self.first, self.ahead = epoch, first, ahead
        m = epoch.plan.spec.mini_batch
        candidates = min(stop - first, group_steps(m))  # steps of m distinct samples that fit
        places = epoch.places[first * m : (first + candidates) * m].reshape(candidates, m)
        unique, counts, which = first_seen(places)
        lengths = epoch.spans[unique, 1] - epoch.spans[unique, 0]
        room = aligned(lengths)  # each sample's bytes, to the next block
        step_bytes = np.bincount(np.repeat(np.arange(candidates), counts), weights=room, minlength=candidates)
        before = np.cumsum(step_bytes) - step_bytes  # bytes of the steps before each
        samples_before = np.cumsum(counts) - counts
        fits = (samples_before < GROUP_SAMPLES) & (before < GROUP_BYTES)
        fits[0] = True
        steps = int(np.argmin(fits)) if not fits.all() else candidates  # the first that does not fit ends the group
        self.end = first + steps
        n = int(counts[:steps].sum())
        self.m, self.unique, self.lengths, self.which = m, unique[:n], lengths[:n], which[: steps * m]
        self.bases = before[:steps].astype(np.int64)
        self.valid = epoch.valid[first * m : self.end * m]
        self.last = np.cumsum(counts[:steps]) - 1  # each step's last distinct sample (in unique)
        self.ok, self.buf = False, np.empty(0, dtype=np.uint8)
        total = int(self.bases[-1] + step_bytes[steps - 1])
        if (steps > 1 or ahead) and total <= GROUPED_SAMPLE_BYTES * n:  # (a group of one is a step alone, but ahead)
            try:
                self._make(total, (np.cumsum(room[:n]) - room[:n]).astype(np.int64))
            except NotDirect:
                return
            self.ok = True

    def _make(self, total: int, starts: np.ndarray) -> None:
        epoch, unique, m = self.epoch, self.unique, self.m
        if not epoch.sane[unique].all() or any_excluded(epoch.reading, epoch.index[unique]):
            raise NotDirect()
        self.buf = epoch.source.buffers.get(total, self.ahead)
        read_spans(epoch.reading, unique, epoch.spans[unique], self.buf, starts)
        ends = starts + self.lengths
        fields = located_fields(epoch.reading, epoch.index[unique], unique, self.buf, starts, ends)
        packing = epoch.reading.cfg.packing
        rows = self.rows = np.empty((len(self.which), packing.header_columns), dtype=np.int64)
        rows[:, INDEX_COLUMN] = epoch.index[unique][self.which]
        rows[:, VALID_COLUMN] = np.where(self.valid, STATUS_VALID, STATUS_PADDING)
        shift = np.repeat(aligned(m * packing.header_bytes) - self.bases, m)  # offsets from each step's table
        for column, values in fields:
            rows[:, column] = values[self.which] + shift if column in epoch.offset_columns else values[self.which]
        self.sizes = (ends[self.last] - self.bases).tolist()
        self.bases, self.last = self.bases.tolist(), self.last.tolist()


class GroupedStep:
    """Step ``j`` of a ``StepGroup``, written into a slot: its rows, then its bytes (one copy each)."""

    def __init__(self, group: StepGroup, j: int):
        self.group, self.j = group, j
        self.rows = group.rows[j * group.m : (j + 1) * group.m]
        self.at = aligned(self.rows.nbytes)
        self.capacity = self.at + group.sizes[j]

    def __len__(self) -> int:
        return len(self.rows)

    def write(self, out: np.ndarray) -> int:
        """Write the table into ``out``; the bytes it takes."""
        if self.capacity > len(out):
            raise Grow(self.capacity)
        group, j = self.group, self.j
        out[: self.rows.nbytes] = self.rows.reshape(-1).view(np.uint8)
        base, size = group.bases[j], group.sizes[j]
        out[self.at : self.at + size] = group.buf[base : base + size]
        group.epoch.good.remember(place=int(group.unique[group.last[j]]))
        return self.capacity
