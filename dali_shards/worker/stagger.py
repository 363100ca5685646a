"""When each worker of a rank does the heavier work of its epochs, spread over the epoch's steps.

Every worker of a rank turns to the next epoch at the same step (a batch takes a mini-batch from
each), so whatever a worker does once per epoch or once per group of steps -- plan the next epoch,
read a group of small steps at once (``grouped.py``) -- all of them would do at the same step, and
on a few cores they would hold the CPU the main process needs for the steps still to come: a stall
near every epoch's end. Instead:

- a worker's groups of ``g = min(group, steps)`` steps begin at its *phase* and every ``g`` steps
  after it; the phases of a rank's workers spread over ``g`` steps (``first_phase``), so that at any
  step about ``1 / g`` of them read a group;
- its last group of an epoch reaches into the next epoch as far as a whole group would
  (``carried`` steps): those are read with it, while the epoch is still read (the next epoch's
  *opening* group), and the next epoch's phase is where that group ends (``next_phase``): groups
  follow one another across epochs as within one, every one of ``g`` steps;
- a worker prepares its next epoch (plans it and reads its opening group: ``PlannedWorkerSource.prepare``)
  at the step its last group begins (``last_start``), or, where its steps are not grouped, at step
  ``worker * steps // workers`` (``prepare_step``).

Pure; imports no DALI.
"""

from __future__ import annotations


def prepare_step(worker: int, workers: int, steps: int) -> int:
    """The step of an epoch of ``steps`` steps at which local worker ``worker`` of ``workers``
    prepares its next epoch where its steps are not grouped (the workers spread evenly over the
    epoch; ``steps`` when the epoch has none: never)."""
    return worker * steps // max(1, workers) if steps > 0 else steps


def first_phase(worker: int, workers: int, steps: int, group: int) -> int:
    """The phase of local worker ``worker`` of ``workers`` in an epoch of ``steps`` steps, groups of
    ``group`` steps, where nothing was carried from the epoch before: spread over a group."""
    return worker * max(0, min(group, steps)) // max(1, workers)


def group_end(first: int, phase: int, group: int, steps: int) -> int:
    """Where the group of steps that begins at step ``first`` ends: the next step of the worker's
    phase (``phase + k * min(group, steps)``), or the epoch's end."""
    g = max(1, min(group, steps))
    if first < phase:
        return min(phase, steps)
    return min(steps, phase + ((first - phase) // g + 1) * g)


def last_start(phase: int, group: int, steps: int) -> int:
    """The step at which a worker's last group of an epoch begins (``steps`` if it has none)."""
    g = min(group, steps)
    if g <= 0 or phase >= steps:
        return steps
    return phase + (steps - 1 - phase) // g * g


def carried(phase: int, group: int, steps: int) -> int:
    """How many steps of the next epoch a worker's last group of this one reaches into: read with
    it, as the next epoch's opening group."""
    start = last_start(phase, group, steps)
    return start + min(group, steps) - steps if start < steps else 0


def next_phase(carried_steps: int, group: int, steps: int) -> int:
    """The phase of an epoch of ``steps`` steps into which the epoch before carried
    ``carried_steps`` steps (its opening group: the steps before the phase)."""
    g = min(group, steps)
    return carried_steps % g if g > 0 else 0
