"""The cross-rank plan check's fingerprint, where earlier releases had it (as ``plan_summary``): it
lives in ``dali_shards/session/plancheck.py`` as ``plan_fingerprint`` (the check itself runs in the
run session). ``dali-shards plan``'s report is ``tools.plan_report.plan_report``."""

from dali_shards.session.plancheck import plan_fingerprint

plan_summary = plan_fingerprint  # the name earlier releases exported

__all__ = ["plan_fingerprint", "plan_summary"]
