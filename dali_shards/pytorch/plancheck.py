"""The cross-rank plan check's summary, where earlier releases had it: it lives in
``dali_shards/session/plancheck.py`` (the check itself runs in the run session)."""

from dali_shards.session.plancheck import plan_summary

__all__ = ["plan_summary"]
