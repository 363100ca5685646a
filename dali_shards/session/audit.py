"""The audit of a finished epoch (``audit=True``): what every rank received, gathered through the
framework's collectives (``feed.Ranks``; this rank's part alone without a process group), checked
against the plan draw for draw (``plan/audit.py``)."""

from __future__ import annotations

import logging
from typing import Any, Dict

from dali_shards.plan.audit import EpochRecord, check_plan, expected_indices, lost_shards, summarize
from dali_shards.session.feed import Ranks

log = logging.getLogger(__name__)


def audit_epoch(info: Any, epoch: int, plan: Any, record: EpochRecord, ranks: Ranks) -> Dict[str, Any]:
    """The report of ``epoch`` (``plan``: its plan from where the run started it) from ``record``, what
    this rank received, and every other rank's (a collective call under a process group); logged
    as a warning unless every draw arrived exactly once."""
    lengths = info.resolved.lengths
    mine = record.as_tuple()
    if ranks.size() is None:  # this rank alone: compare with its own share of the plan
        received, expected = [mine], expected_indices(plan, lengths, info.rank)
    else:
        received = ranks.gather_objects((mine[0].tolist(), mine[1].tolist(), mine[2]))
        expected = expected_indices(plan, lengths)
    # a resumed epoch: its plan against the draws left, found without re-planning
    left = info.draws_left(epoch) if plan is info.resume_plan else None
    checked = None if left is None else check_plan(plan, left, lengths)
    stream_of = info.packing.stream_of if info.mixture is not None else None
    report = summarize(epoch, received, expected, lost_shards(info.shards), stream_of, checked)
    report["rank"] = info.rank if len(received) == 1 else None
    if not report["exactly_once"]:
        log.warning("dali_shards: audit of epoch %d: %s", epoch, report)
    return report
