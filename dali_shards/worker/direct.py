"""The ring's fast path: a step's samples read as they lie in their shards, located and checked
with NumPy (``located.py``), no Python object per sample or member.

For the common case -- planned epochs, no ``map``/``decoders``/``bucket_by``, byte, integer, key,
index and valid fields, local shards whose sample offsets are known -- a worker writes each step's
table into its slot itself: header rows, then each sample's span as it lies in the shard, its
members found by ``tar/blocks.py``, the rows pointing at the members' bytes (a key at its header's
name). A step's NumPy work costs about the same for 16 samples as for 256, so small steps (under
``GROUPED_BELOW`` samples: a batch shared by many workers) are read and located in groups of about
``GROUP_SAMPLES`` or ``GROUP_BYTES``, samples of up to ``GROUPED_SAMPLE_BYTES`` on average (``grouped.py``:
one ``preadv`` per sample into the group's buffer, laid out as in the slots, then one copy per
step into its slot); a step of that size or more is read straight into its slot (one ``preadv``
per sample from the page cache into shared memory: the only copy). Integers are parsed, keys checked against the
index's fingerprints and images checked per sample, in place. Anything out of the ordinary in a
step (an irregular member, a bad or missing field, a damaged image, a stale index, a read error)
makes the whole step go the general way (``Interleaved`` per sample, ``Packing.table_array``),
which raises or skips exactly as it always does. Imports no DALI.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from dali_shards.worker.grouped import GroupedStep, StepGroup, first_seen, group_steps
from dali_shards.worker.located import NotDirect, aligned, any_excluded, layout, located_fields, offset_columns, read_spans
from dali_shards.ipc.packed import INDEX_COLUMN, STATUS_PADDING, STATUS_VALID, VALID_COLUMN, Packed, table_rows
from dali_shards.worker.pieces import Interleaved
from dali_shards.worker.clock import StepClock
from dali_shards.worker.stagger import carried, first_phase, group_end, last_start, next_phase, prepare_step
from dali_shards.worker.reader import Skipped
from dali_shards.worker.standin import StandIn
from dali_shards.ipc.tables import Grow
from dali_shards.fields import FieldKind
from dali_shards.plan.mode import Planned

DIRECT_KINDS = frozenset({FieldKind.BYTES, FieldKind.INT, FieldKind.KEY, FieldKind.INDEX, FieldKind.VALID, FieldKind.STREAM})
GROUPED_BELOW = 96  # steps of fewer samples are read and located in groups (``grouped.py``: their fixed cost would dominate)


def direct_fits(config: Any) -> bool:
    """Whether a worker's steps can take the fast path, as far as its options say (the shards
    are checked per epoch)."""
    packing, stage = config.packing, config.stage
    return (
        packing.table and packing.payload is None and not stage.user_code
        and all(f.kind in DIRECT_KINDS for f in packing.fields) and isinstance(config.mode, Planned)
    )  # fmt: skip


class DirectBatches:
    """One epoch of a worker's steps as ``DirectStep``s (the ring's fast path), stamped in the
    control block and cut short where the main process says, as ``planned.EpochBatches``. Small
    steps are read and located in groups (``StepGroup``): the fixed cost of a step's NumPy work is
    paid once per group. The groups begin at this worker's steps (``stagger.py``: from ``phase``,
    every ``group_steps``); the steps before ``phase`` are the group that opens the epoch, read
    ahead with the epoch before's last group where the epoch was prepared (``prepare``). At step
    ``prepare_at`` (where its last group begins) the next epoch is prepared
    (``PlannedWorkerSource.prepare``)."""

    def __init__(self, source: Any, epoch: int, plan: Any, emissions: Sequence[Tuple[int, bool]]):
        self.source, self.epoch, self.plan = source, epoch, plan
        order = list(dict.fromkeys(pos for pos, _ in emissions))
        self.place = {pos: k for k, pos in enumerate(order)}
        self.places = np.fromiter((self.place[p] for p, _ in emissions), np.int64, len(emissions))  # per slot, in order
        self.valid = np.fromiter((ok for _, ok in emissions), bool, len(emissions))
        reader = source.reader(plan)
        self.reading = reading = Interleaved(plan, order, self.place.__contains__, reader)
        self.good = StandIn(reading.cfg, reread=reading.item)
        cfg = reading.cfg
        offsets = {s: cfg.sample_offsets(s) for s in set(reading.shards)}
        self.spans = np.array([(int(offsets[s][i]), int(offsets[s][i + 1]))  # type: ignore[index]  # positioned: known
                               for s, i in zip(reading.shards, reading.local)], dtype=np.int64).reshape(-1, 2)  # fmt: skip
        self.index = plan.canonical_starts[np.asarray(reading.shards, dtype=np.int64)] + np.asarray(reading.local)
        sizes = np.array([-1 if cfg.byte_sizes[s] is None else cfg.byte_sizes[s] for s in reading.shards], np.int64)
        # spans inside their shards as counted: a bad or stale index takes the general way, which says so
        self.sane = (self.spans[:, 0] <= self.spans[:, 1]) & (self.spans[:, 1] <= sizes)
        self.offset_columns = offset_columns(cfg.packing)
        self.steps = count = plan.steps - plan.start_step
        self.clock = iter(StepClock(source.stamps, epoch, count))
        self.group: Optional[StepGroup] = None
        m, worker, workers = plan.spec.mini_batch, source.config.worker, source.config.spec.py_num_workers
        self.group_steps = group_steps(m) if m < GROUPED_BELOW else 0  # (0: every step read straight into its slot)
        self._phase(first_phase(worker, workers, count, self.group_steps))
        if not self.group_steps:
            self.prepare_at = prepare_step(worker, workers, count)
        self.opening: Optional[StepGroup] = None  # the steps before the phase, read ahead

    def _phase(self, phase: int) -> None:
        self.phase = phase
        self.prepare_at = last_start(phase, self.group_steps, self.steps)

    def prepare(self, carried_steps: Optional[int] = None) -> None:
        """Read ahead the group that opens the epoch (its steps before ``phase``: those the epoch
        before's last group reaches into, ``carried_steps``), while the epoch before is read, beside
        that last group (``GroupBuffers``)."""
        if not self.group_steps or self.opening is not None:
            return
        if carried_steps is not None:
            self._phase(next_phase(carried_steps, self.group_steps, self.steps))
        if self.phase > 0:
            self.opening = StepGroup(self, 0, self.phase, ahead=True)

    def close(self) -> None:
        """Close the epoch's reading (an epoch prepared but never asked for, too)."""
        self.reading.close()

    def __iter__(self) -> "DirectBatches":
        return self

    def __next__(self) -> Union["DirectStep", "GroupedStep"]:
        try:
            step = next(self.clock)
        except StopIteration:
            self.reading.close()
            raise
        out = self._step(step)
        if step == self.prepare_at:  # (with its last group: the steps of the next epoch that group reaches into)
            reach = carried(self.phase, self.group_steps, self.steps) if self.group_steps else None
            self.source.prepare(self.epoch + 1, reach)
        return out

    def _step(self, step: int) -> Union["DirectStep", "GroupedStep"]:
        if not self.group_steps:  # read straight into the slot: one copy
            places, valid = self.step(step)
            return DirectStep(self, places, valid)
        if self.group is None or not self.group.first <= step < self.group.end:
            opening, self.opening = self.opening, None
            if opening is not None and opening.first == step:
                self.group = opening
            else:
                self.group = StepGroup(self, step, group_end(step, self.phase, self.group_steps, self.steps))
        if self.group.ok:
            return GroupedStep(self.group, step - self.group.first)
        places, valid = self.step(step)
        return DirectStep(self, places, valid)

    def step(self, step: int) -> Tuple[np.ndarray, np.ndarray]:
        """The places (in the reading order) of step ``step``'s samples, and which are valid."""
        m = self.plan.spec.mini_batch
        return self.places[step * m : (step + 1) * m], self.valid[step * m : (step + 1) * m]


class DirectStep:
    """One step's table, written into a slot by ``write`` (see the module). ``capacity`` bounds what
    the fast path writes; the general way may need more (``Grow``: ask again with a larger slot)."""

    def __init__(self, epoch: DirectBatches, places: np.ndarray, valid: np.ndarray):
        self.epoch, self.reading, self.good = epoch, epoch.reading, epoch.good
        self.places, self.valid = places, valid
        self.packing = self.reading.cfg.packing
        self.unique, _, self.which = first_seen(places[None, :])  # padding repeats the last sample
        self.rows_bytes = len(self.places) * self.packing.header_bytes
        self.spans = epoch.spans[self.unique]
        lengths = self.spans[:, 1] - self.spans[:, 0]
        self.starts = aligned(self.rows_bytes) + layout(lengths)
        self.capacity = int(self.starts[-1] + lengths[-1]) if len(lengths) else self.rows_bytes
        self._packed: Optional[List[Packed]] = None

    def __len__(self) -> int:
        return len(self.places)

    def write(self, out: np.ndarray) -> int:
        """Write the table into ``out``; the bytes it takes."""
        if self._packed is None:
            try:
                return self._direct(out)
            except NotDirect:
                pass  # (the general way outside the handler: its errors do not chain to NotDirect)
            self._packed = self._general()
        size = self.packing.table_size(self._packed)
        if size > len(out):
            raise Grow(size)
        self.packing.table_array(self._packed, out=out[:size])
        return size

    # -- the fast path ---------------------------------------------------------------------
    def _direct(self, out: np.ndarray) -> int:
        if not self.epoch.sane[self.unique].all() or any_excluded(self.reading, self.epoch.index[self.unique]):
            raise NotDirect()  # (before any slot is asked for: an insane span claims any size)
        if self.capacity > len(out):
            raise Grow(self.capacity)
        read_spans(self.reading, self.unique, self.spans, out, self.starts)
        ends = self.starts + (self.spans[:, 1] - self.spans[:, 0])
        fields = located_fields(self.reading, self.epoch.index[self.unique], self.unique, out, self.starts, ends)
        rows = table_rows(out, len(self.places), self.packing.header_columns)
        which = self.which
        rows[:, INDEX_COLUMN] = self.epoch.index[self.unique][which]
        rows[:, VALID_COLUMN] = np.where(self.valid, STATUS_VALID, STATUS_PADDING)
        for column, values in fields:
            rows[:, column] = values[which]
        self.good.remember(place=int(self.unique[-1]))
        return self.capacity

    # -- the general way ---------------------------------------------------------------------
    def _general(self) -> List[Packed]:
        """The step's samples read and packed one by one, errors raised or skipped as always; a
        skipped sample's stand-in is the last good sample before it (as ``EpochBatches`` picks it)."""
        unique = self.unique.tolist()
        items: Dict[int, Any] = {k: self.reading.item(k) for k in unique}
        out, good = [], None
        for k, valid in zip(self.places.tolist(), self.valid.tolist()):
            item = items[k]
            if isinstance(item, Skipped):
                stand_in = good or self.good.sample(items[j] for j in unique)
                out.append(stand_in.as_skipped(item.index) if valid else stand_in.as_padding())
                continue
            if valid:
                good = item
                self.good.remember(item, k)
            out.append(item if valid else item.as_padding())
        return out


