"""What every framework's iterator says of its run session, written once: the public properties
and methods that are the session's own (``info``, ``epoch``, ``step``, ``len()``, the audits and
incidents, ``state_dict()`` / ``load_state_dict()``, ``iter()`` and ``reset()``). An adapter
(``dali_shards.pytorch``, ``dali_shards.jax``) keeps its session in ``_session`` and adds only its
batches' types. Imports no framework and no DALI."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Self

from dali_shards.session.run import RunSession
from dali_shards.setup.info import ShardedPipelineInfo


class SessionAdapter:
    """The session's public face, for a framework's iterator holding it as ``_session``."""

    _session: RunSession

    @property
    def info(self) -> ShardedPipelineInfo:
        """The pipeline's ``ShardedPipelineInfo`` (``pipe.dali_shards``; a rebuilt pipeline's after a resume)."""
        return self._session.info

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._session.epoch

    @property
    def audit(self) -> bool:
        """Whether each finished epoch is audited (``audits``)."""
        return self._session.audit

    @property
    def audits(self) -> List[Dict[str, Any]]:
        """The report of each epoch audited (``audit=True``), in order."""
        return self._session.audits

    @property
    def incidents(self) -> List[Dict[str, Any]]:
        """Each sample a DALI operator failed on, skipped (``on_error="skip"``), with its costs."""
        return self._session.incidents

    @property
    def step(self) -> int:
        """Steps of the current epoch taken so far on this rank: the batches returned, and those the
        runs its ``resume_from`` state came from took in that epoch (after a resume under the same
        layout, the state's step; under another layout, the steps of the layouts before it, then
        on). It never goes back within an epoch; ``len(it)`` counts the batches this iterator
        delivers in the epoch from where it started it."""
        return self._session.step

    def __len__(self) -> int:
        """Batches this iterator delivers in the current epoch, from where it started it: the steps
        per epoch, or what was left of the epoch it resumed in."""
        return len(self._session)

    def state_dict(self) -> Dict[str, Any]:
        """Where the epoch stands: a small JSON-able dict, the same on every rank (its fields:
        ``dali_shards.plan.statecheck.State``)."""
        return self._session.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict()`` (of this run, or of one on another number of ranks):
        the pipeline is rebuilt to resume there."""
        self._session.load_state_dict(state)

    def __iter__(self) -> Self:
        """The iterator itself: a loop continues the current epoch where it stands (after every
        batch of an epoch was taken, the next epoch)."""
        self._session.loop()
        return self

    def reset(self) -> None:
        """Leave the current epoch and get ready for the next one; nothing to do at its start.

        The workers are told to end the epoch after the batches they may already have prepared
        (about ``prefetch_queue_depth + worker_prefetch + 1``); those are read and discarded. The
        next epochs, and states saved in them, are whole and exactly once as ever."""
        self._session.reset()
