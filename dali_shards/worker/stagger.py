"""When each worker of a rank does the heavier work of its epochs, spread over the epoch's steps.

Every worker of a rank turns to the next epoch at the same step (a batch takes a mini-batch from
each), so whatever a worker does once per epoch or once per group of steps -- plan the next epoch,
read a group of small steps at once (``grouped.py``) -- all of them would do at the same step, and
on a few cores they would hold the CPU the main process needs for the steps still to come: a stall
near every epoch's end. Instead local worker ``w`` of ``W`` prepares its next epoch (its plan,
its order, and the group of steps that opens it: ``WorkerSource.prepare``) at step
``w * steps // W`` of the epoch before, and begins its groups at steps ``phase + k * group`` (the
first group of an epoch, before ``phase``, is the one read ahead): at any step about ``1 / group``
of the workers read a group. Pure; imports no DALI.
"""

from __future__ import annotations


def prepare_step(worker: int, workers: int, steps: int) -> int:
    """The step of an epoch of ``steps`` steps at which local worker ``worker`` of ``workers``
    prepares its next epoch (the workers spread evenly over the epoch; ``steps`` when the epoch has
    none: never)."""
    return worker * steps // max(1, workers) if steps > 0 else steps


def group_phase(worker: int, workers: int, steps: int, group: int) -> int:
    """The step at which local worker ``worker``'s groups of ``group`` steps begin (then every
    ``group`` steps) in an epoch of ``steps`` steps: the workers spread over a group's steps (or the
    epoch's, if shorter). Never after its ``prepare_step``, so that the next epoch's first group
    (steps before the phase) is made after the steps before this epoch's phase are handed on."""
    return worker * max(0, min(group, steps)) // max(1, workers)


def group_end(first: int, phase: int, group: int, steps: int) -> int:
    """Where the group of steps that begins at step ``first`` ends: the next step of the worker's
    phase (``phase + k * group``), or the epoch's end."""
    if first < phase:
        return min(phase, steps)
    return min(steps, phase + ((first - phase) // max(1, group) + 1) * max(1, group))
