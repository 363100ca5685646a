"""What travels, decided from the first sample when the pipeline is built (no DALI).

DALI fixes each output's dtype and number of dimensions when the pipeline is built, but a
``map``'s outputs, and ``.npy`` fields, are only known by running it. So the main process reads the
first sample of the first shard that has one, runs the worker's stage on it (decoders, ``map``),
and takes the types from there; later samples must keep them. Errors in user code surface here,
at build time, naming the shard and the sample; under ``on_error="skip"`` the next samples are
tried. The first samples' members are also where a misspelled field is found (``check_fields_present``),
and the pipeline function's parameters are checked against the fields (``check_graph_call``).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from dali_shards.catalog.columns import Catalog
from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.errors import ConfigError, EmptyDatasetError, ShardError
from dali_shards.io.storage import open_shard, shard_cache
from dali_shards.tar.format import TarReader
from dali_shards.tar.members import RawSample
from dali_shards.options import OnError, ShardedOptions
from dali_shards.worker.outputs import check_npy_dtype
from dali_shards.worker.outputs import OutputSpec, classify
from dali_shards.worker.stage import SampleStage
from dali_shards.worker.usercode import KeptRngs
from dali_shards.fields import SPECIAL_FIELDS, input_spec

PROBE_SAMPLES = 100  # samples tried with on_error="skip" before giving up


def output_names(func: Any, fn_args: Sequence[Any] = (), fn_kwargs: Optional[Dict[str, Any]] = None) -> Tuple[str, ...]:
    """The outputs a ``map`` must return: the function's parameters without defaults, in order,
    but those given when calling it (``fn_args`` fill the last of them, ``fn_kwargs`` by name)."""
    fn_kwargs = fn_kwargs or {}
    params = inspect.signature(func).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        raise ConfigError(
            f"with map=, {getattr(func, '__name__', func)}() must name its parameters after the map's outputs "
            "(no *args or **kwargs)"
        )
    names = [p.name for p in params if p.default is p.empty and p.name not in fn_kwargs]
    names = names[: len(names) - len(fn_args)] if fn_args else names
    if not names:
        raise ConfigError(f"with map=, {getattr(func, '__name__', func)}() needs parameters: the map's outputs")
    return tuple(names)


def check_graph_call(func: Any, fields: Sequence[str], fn_args: Sequence[Any] = (),
                     fn_kwargs: Optional[Dict[str, Any]] = None) -> None:  # fmt: skip
    """A ConfigError naming the function and ``fields`` unless the pipeline function (without a
    ``map``) takes one argument per field, in order, then ``fn_args`` and ``fn_kwargs``."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # (no signature to read: DALI's tracing says what is wrong)
        return
    try:
        signature.bind(*fields, *fn_args, **(fn_kwargs or {}))
    except TypeError as exc:
        name = getattr(func, "__name__", repr(func))
        given = f" and {len(fn_args)} more positional argument(s)" if fn_args else ""
        raise ConfigError(
            f"{name}{signature} cannot take the fields: it is called with one argument per field of fields="
            f"{tuple(fields)!r}, in order{given} ({exc}): give {name} one parameter per field (the other parameters "
            "with defaults), or ask for the fields it takes"
        ) from None


def check_fields_present(options: ShardedOptions, shards: Sequence[ShardInfo]) -> None:
    """A ConfigError naming a requested field that no sample seen holds: the first sample lacks it,
    and so do the next ones of its shard (up to ``PROBE_SAMPLES``) and the member statistics of
    every shard, where known. It says which extensions the samples hold and the nearest one (a
    misspelled field, found when the pipeline is built, not at the first batch). A field only some
    samples lack is left to the workers (``on_error``); a shard that cannot be read too."""
    wanted = [(name, exts) for name, _, exts in (input_spec(f, options.fields) for f in options.fields) if exts]
    first = next((s for s in shards if s.samples != 0), None)
    if not wanted or first is None:
        return
    seen: List[RawSample] = []
    stop = min(PROBE_SAMPLES, first.samples) if first.samples > 0 else PROBE_SAMPLES  # (-1: not counted)
    cache = shard_cache(options.storage)  # a look: a cached copy read, nothing cached
    at = (cache.lookup(first.url, first.bytes) if cache is not None else None) or first.url
    uncached = dataclasses.replace(options.storage, cache_dir=None, cache_limit=None)
    try:
        with open_shard(at, uncached, first.bytes) as stream:
            for sample in TarReader(stream, first.url).samples(set(), stop=stop):
                seen.append(sample)
                if not _lacking(wanted, seen):
                    return
    except ShardError:
        return  # (the workers name the damage, as ``on_error`` says)
    for name, exts in _lacking(wanted, seen):
        held = shards.ext_present(exts).any() if isinstance(shards, Catalog) else \
            any(s.ext_bytes and any(e in s.ext_bytes for e in exts) for s in shards)  # fmt: skip
        if not held:
            raise _missing_field(options.fields, name, exts, seen)


Wanted = List[Tuple[str, Tuple[str, ...]]]  # a field's name and the extensions that may provide it


def _lacking(wanted: Wanted, seen: Sequence[RawSample]) -> Wanted:
    """The fields of ``wanted`` that none of the samples ``seen`` holds."""
    if not seen:
        return []
    return [(n, exts) for n, exts in wanted if not any(e in s.extensions for s in seen for e in exts)]


def _missing_field(fields: Sequence[str], name: str, exts: Sequence[str], seen: Sequence[RawSample]) -> ConfigError:
    have = sorted({e for s in seen for e in s.extensions})
    close = [m for e in exts for m in difflib.get_close_matches(e, have, n=1, cutoff=0.6)]
    first = seen[0]
    which = (f"the first sample ({first.key!r}) of shard {first.url!r} has no member for it (it has: "
             if len(seen) == 1 else
             f"none of the first {len(seen)} samples of shard {first.url!r} has a member for it (they have: ")  # fmt: skip
    return ConfigError(
        f"fields={tuple(fields)!r}: field {name!r} is in no sample read: {which}{', '.join(have) or 'no members'})"
        + (f": did you mean {close[0]!r}?" if close else ".")
        + " Request the extensions the samples hold (alternatives as 'jpg;png')"
    )


def samples(shards: Sequence[ShardInfo], options: ShardedOptions, extensions) -> Iterator[Tuple[RawSample, int]]:
    """(sample, canonical index) of the first samples of the shards, in order."""
    start = 0
    for shard in shards:
        if shard.samples > 0:
            with open_shard(shard.url, options.storage, shard.bytes) as stream:
                for sample in TarReader(stream, shard.url).samples(extensions, stop=shard.samples):
                    yield sample, start + sample.position
        start += shard.samples


def first_sample_outputs(
    options: ShardedOptions, shards: Sequence[ShardInfo], stage: SampleStage, names: Sequence[str]
) -> Tuple[List[OutputSpec], Dict[str, int]]:
    """The specs of the outputs ``names`` (with a ``map``) or of the ``.npy`` fields (without),
    and their sizes in bytes, from the first sample the stage handles."""
    error: Optional[ShardError] = None
    for tried, (sample, index) in enumerate(samples(shards, options, stage.codec.extensions)):
        if tried >= PROBE_SAMPLES:
            break
        try:
            with KeptRngs():  # the user's random streams in this process stay as they were
                return _specs(stage, sample, index, names)
        except ShardError as exc:
            if options.on_error is OnError.RAISE:
                raise
            error = error or exc
    if error is not None:
        raise error
    raise EmptyDatasetError("the shards hold no samples")


def _specs(stage: SampleStage, sample: RawSample, index: int, names: Sequence[str]):
    inputs = stage.inputs(sample, index)
    if not stage.mapped:
        arrays = [check_npy_dtype(sample, n, inputs[n]) for n in names]  # a type DALI cannot carry: named here
        return [OutputSpec(n, "array", a.dtype.name, a.ndim) for n, a in zip(names, arrays)], {}
    result = stage.run_map(sample, inputs)
    specs, sizes = [], {}
    for name in names:
        if name in SPECIAL_FIELDS:
            specs.append(OutputSpec(name, "special"))
            continue
        stage.outputs(sample, result, [OutputSpec(name, "array")], check_types=False)  # present?

        def convert(name: str = name) -> Tuple[OutputSpec, Any]:
            return classify(name, result[name])

        spec, value = stage.check(sample, convert)
        specs.append(spec)
        sizes[name] = getattr(value, "nbytes", 8)
    return specs, sizes
