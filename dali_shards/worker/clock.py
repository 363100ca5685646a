"""The steps of one worker epoch, stamped in the control block: the one loop every source runs
(planned, the ring's fast path, streaming). The watchdog and the epoch cut, which keep DDP from
hanging, read these stamps. Imports no DALI.

A step begins when it is asked for and ends when the next one is (its batch made and handed on);
while it waits for its consumer in between -- for a free slot to make the batch in (the ring), or,
the batch made, for DALI to ask for the next (merge) -- the worker is stamped as waiting
(``waiting``), so that the watchdog never blames a worker for its consumer. The epoch
ends after its last step, or at the step where the main process cut it short (read again before
every step), stamped once more as it ends.
"""

from __future__ import annotations

from typing import Any, Iterator


class StepClock:
    """``steps`` steps of ``epoch`` (fewer where the main process cuts the epoch), stamped in a
    worker's ``stamps`` (``ipc.control.WorkerStamps``, or ``NO_STAMPS``): iterate it for the step
    numbers, from 0."""

    def __init__(self, stamps: Any, epoch: int, steps: int):
        self.stamps, self.epoch, self.steps = stamps, epoch, steps
        self.step = 0  # steps handed on so far

    def ends_at(self) -> int:
        """The step this epoch ends at: its last, or where the main process cut it short."""
        cut = self.stamps.cut_step(self.epoch)
        return self.steps if cut is None else min(cut, self.steps)

    def __iter__(self) -> Iterator[int]:
        stamps, epoch = self.stamps, self.epoch
        while self.step < self.ends_at():
            stamps.begin(epoch, self.step)
            yield self.step
            self.step += 1
            stamps.end(epoch, self.step)
        stamps.end(epoch, self.step, produced=False)
