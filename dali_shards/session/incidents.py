"""When a DALI operator fails on a step: which samples it failed on, named by shard, position
and key, and the error that says so.

DALI stops its pipeline on the first sample an operator cannot take (an image its decoder
rejects, a crop window larger than the image, the user's ``fn.python_function`` raising) and
cannot replace it. We own the plan, so the step's samples are known: DALI's CPU decoder names the
sample's place in the batch; otherwise the step's samples are read again in this process and run
through the pipeline's own definition (``pipeline/probe.py``) until the ones it fails on alone are
found. Under ``on_error="raise"`` that is one ``ShardFormatError`` naming the shard, the key and
the operator. Under ``"skip"`` it is a ``SampleFailure`` the run session catches: it adds the
samples to the run's excluded ones (carried by its states), rebuilds the pipeline from the state at
that step, and the workers read those samples as skipped -- their places padding marked invalid, as
for any skipped sample, every other rank untouched (``RunSession``).

The structural check in the workers (``worker/imagecheck.py``) catches most damage first, as a
skippable per-sample error; what it misses (a frame header of 0x0 or 65000x65000 pixels, damage
inside the compressed data, a crop window larger than the image) fails in DALI. Imports no DALI
but to re-run samples (``pipeline/probe.py``, when an incident needs it).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import Any, Dict, List, Optional, Tuple

from dali_shards.errors import ShardFormatError
from dali_shards.options import OnError
from dali_shards.io.storage import local_path, open_shard
from dali_shards.plan.geometry import shard_of
from dali_shards.plan.mode import Streaming
from dali_shards.tar.format import TarReader
from dali_shards.tar.header import printable
from dali_shards.worker.imagecheck import IMAGE_EXTENSIONS
from dali_shards.worker.reader import ShardReader, Skipped

log = logging.getLogger(__name__)
TAKEN_SEARCH = 1024  # samples tried for one DALI takes, where every sample of the failing steps failed

_OPERATOR = re.compile(r"Error in (?:CPU|GPU|MIXED|Mixed|mixed) operator `([^`]+)`")
FAILED_SAMPLE = re.compile(r"Failed to decode sample #(\d+)")  # DALI's decoders name the batch place


class SampleFailure(Exception):
    """DALI failed on ``samples`` (``[{"index", "shard", "key"}]``) at ``step`` of ``epoch``; raised
    for the run session to skip them (``on_error="skip"``). ``seconds`` says what finding them took;
    ``good``, a sample of the step DALI took (None if not known)."""

    def __init__(self, epoch: int, step: int, samples: List[Dict[str, Any]], operator: str, seconds: float,
                 good: Optional[int] = None):  # fmt: skip
        super().__init__(f"DALI's {operator} failed on {samples} at step {step} of epoch {epoch}")
        self.epoch, self.step, self.samples, self.operator, self.seconds = epoch, step, samples, operator, seconds
        self.good = good


def operator_of(text: str) -> str:
    """The DALI operator an error message names (``"a DALI operator"`` if none)."""
    found = _OPERATOR.search(text)
    return f"operator {found.group(1)}" if found else "a DALI operator"


def dali_failure(
    exc: BaseException, info: Any, epoch: int, step: int, known_good: Optional[int] = None, ahead: int = 0
) -> Optional[Exception]:
    """What to raise for a DALI error while fetching ``step``: a ``SampleFailure``
    (``on_error="skip"``) or a ``ShardFormatError`` naming the samples it failed on, or None if the
    error cannot be traced to samples (then it is raised as it is). DALI's stages may have run up
    to ``ahead`` steps beyond ``step`` (separate CPU and GPU queues), so the failing samples are
    looked for in those steps too, and a sample DALI names by its place is checked before it is
    blamed. ``known_good``: a sample DALI took earlier in the run (without one, one is looked for,
    to stand in for the skipped)."""
    if isinstance(info.mode, Streaming) or info.spec.bucket_window:
        return None  # the samples of a step are not known ahead
    plan = info.plan(epoch)
    if not plan.start_step <= step < plan.steps:
        return None
    text = "\n".join(str(e) for e in (exc, exc.__cause__, exc.__context__) if e is not None)
    found, named = _OPERATOR.search(text), FAILED_SAMPLE.search(text)
    if named is None and (found is None or "external_source" in found.group(1)):
        return None  # not an operator failing on samples (a worker's, the transfer's, DALI's own error)
    operator = operator_of(text)
    started = time.perf_counter()
    batches = plan.rank_batches(info.rank)[0][step : step + ahead + 1]
    excluded = set(info.resolved.excluded)
    fresh = lambda values: [int(i) for i in dict.fromkeys(values) if int(i) not in excluded]  # noqa: E731
    place = int(named.group(1)) if named is not None else -1
    bad, good = _probe(info, plan, fresh(batches[:, place].tolist())) if 0 <= place < batches.shape[1] else ([], None)
    if not bad:  # not named, or not the named place's sample: every sample in flight, tried
        bad, more = _probe(info, plan, fresh(batches.ravel().tolist()))
        good = good if good is not None else more
    if not bad:
        return None
    samples = [_described(info, plan, i) for i in bad]
    if info.on_error is not OnError.SKIP:
        first = samples[0]
        return sample_error(info, first, operator, step, epoch, len(samples))
    if known_good is None and good is None:  # no sample DALI takes known yet: one, to stand in
        good = _first_taken(info, plan, step, excluded | set(bad), operator, epoch)
    return SampleFailure(epoch, step, samples, operator, time.perf_counter() - started, good)


def _first_taken(info: Any, plan: Any, step: int, skip: set, operator: str, epoch: int) -> int:
    """The first sample of this rank's steps from ``step`` on (the failing steps' other samples
    first) that DALI takes, up to ``TAKEN_SEARCH`` samples tried; a ShardFormatError where none is."""
    index = plan.rank_batches(info.rank)[0][step:].ravel().tolist()
    tried = [i for i in dict.fromkeys(int(i) for i in index) if i not in skip][:TAKEN_SEARCH]
    for lo in range(0, len(tried), 64):
        _, good = _probe(info, plan, tried[lo : lo + 64])
        if good is not None:
            return good
    raise ShardFormatError(
        "(several)" if len(info.shards) > 1 else info.shards[0].url,
        f"DALI's {operator} failed on every sample tried in epoch {epoch} ({len(tried)} of this rank's from step "
        f"{step} on, besides those it failed on first): no sample it takes is left to stand in for the skipped ones",
        hint="check the pipeline function on a sample (e.g. the decoder's device and output type) and the shards "
        "with `dali-shards inspect`",
    )


def locate(plan: Any, index: int) -> Tuple[int, int]:
    """The shard and the position in it of the sample at canonical ``index``."""
    shard, position = shard_of(plan.canonical_starts, [index])
    return int(shard[0]), int(position[0])


def _described(info: Any, plan: Any, index: int) -> Dict[str, Any]:
    shard, position = locate(plan, index)
    url = info.shards[shard].url
    return {"index": index, "shard": url, "position": position, "key": key_at(url, position)}


def _probe(info: Any, plan: Any, indices: List[int]) -> Tuple[List[int], Optional[int]]:
    """The step's samples the pipeline fails on alone, found by re-running them (``probe.py``),
    and one it takes."""
    from dali_shards.pipeline.probe import find_failing  # DALI glue: only when an incident needs it

    if info.probe is None:
        return [], None
    plain = info.packing.plain()
    config = info.resolved.workers[0]
    config = dataclasses.replace(config, packing=plain, stage=config.stage.with_packing(plain), excluded=frozenset())
    reader = ShardReader(config)
    samples: List[Tuple[int, Any]] = []
    for index in indices:
        shard, position = locate(plan, index)
        try:
            item = reader.read_one(shard, position, index)
        except ShardFormatError:
            continue  # the workers skip it on their own (on_error="skip") or raised already
        if not isinstance(item, Skipped):
            samples.append((index, item))
    return find_failing(info.probe(plain), samples)


def log_skips(failure: SampleFailure, rebuild_s: float) -> Dict[str, Any]:
    """Log each sample once; the incident as the iterator records it (with its costs)."""
    for s in failure.samples:
        log.warning(
            "dali_shards: skipping sample %r (position %d) of shard %s: DALI's %s failed on it at step %d of epoch %d",
            s["key"], s["position"], s["shard"], failure.operator, failure.step, failure.epoch,
        )  # fmt: skip
    return {
        "epoch": failure.epoch,
        "step": failure.step,
        "operator": failure.operator,
        "samples": [{k: s[k] for k in ("index", "shard", "key")} for s in failure.samples],
        "find_s": round(failure.seconds, 4),
        "rebuild_s": round(rebuild_s, 4),
    }


def excluded_after(resolved: Any, failure: SampleFailure) -> List[int]:
    """The run's excluded samples with the failure's added."""
    return sorted(set(resolved.excluded) | {int(s["index"]) for s in failure.samples})


def sample_error(
    info: Any, sample: Dict[str, Any], operator: str, step: int, epoch: int, count: int = 1
) -> ShardFormatError:
    """The error for ``on_error="raise"``: DALI's ``operator`` failed on ``sample`` (``_described``)."""
    fields = [f.name for f in info.packing.byte_fields if IMAGE_EXTENSIONS.intersection(f.extensions)]
    more = f" ({count - 1} more sample(s) of the step fail too)" if count > 1 else ""
    return ShardFormatError(
        sample["shard"],
        f"DALI's {operator} failed on sample {sample['position']} of the shard (step {step} of epoch {epoch}){more}; "
        f"if it is an image (field {' or '.join(repr(f) for f in fields) or 'none'}), it is damaged in a way "
        f"the workers' image_check={info.options.image_check.value!r} does not catch (e.g. a frame header of "
        "0x0 pixels, or damage inside its compressed data)",
        key=sample["key"],
        hint="on_error='skip' leaves such samples out and goes on (DALIShardedIterator); or remove or re-encode it",
    )


def key_at(url: str, position: int) -> Optional[str]:
    """The key of sample ``position`` of a local shard, from its headers (None if unknown)."""
    if local_path(url) is None:
        return None
    try:
        with open_shard(url) as stream:
            for pos, key, _, _ in TarReader(stream, url).scan():
                if pos == position:
                    return printable(key)
    except Exception:  # noqa: BLE001 - only a better message was at stake
        return None
    return None
