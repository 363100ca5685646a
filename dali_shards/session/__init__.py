"""The run session: everything a run of a sharded pipeline does between DALI and the framework that
takes its batches (epochs and ``len()``, padding masks, state and resume, the cross-rank plan
check, the watchdog, a DALI operator's failures skipped, the audit), whatever the framework: a
framework's adapter gives it a ``Feed`` and ``Ranks`` (``feed.py``) and turns its batches' masks
into its own types (``dali_shards.pytorch``). Imports no framework and no DALI."""

from dali_shards.session.feed import STATUS_OUTPUT, Alone, Feed, Ranks, check_output_map
from dali_shards.session.run import RunSession

__all__ = ["Alone", "Feed", "Ranks", "RunSession", "STATUS_OUTPUT", "check_output_map"]
