"""A write job: the shards planned from the input (``layout``), the ones a re-run keeps
(``fragments``), the rest written by tasks on an engine (local processes or Ray), then merged into
one manifest, written last. The same input, options and seed give the same bytes on any engine."""

from __future__ import annotations

import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from dali_shards.catalog.shardinfo import ShardInfo
from dali_shards.engines.base import Engine, check_engine, make_engine
from dali_shards.errors import ConfigError
from dali_shards.io.filesystems import DEFAULT_STORAGE, is_remote
from dali_shards.options import StorageOptions
from dali_shards.tools import layout
from dali_shards.tools.fragments import Spool, clean, kept_fragments
from dali_shards.tools.inputs import BlocksInput, FilesInput, find_input
from dali_shards.tools.raydata import RayReader
from dali_shards.tools.remotefiles import input_size
from dali_shards.tools.shardtask import PARTS, Target, WindowTask, run_task

log = logging.getLogger("dali_shards")
MANIFEST_NAME = "manifest.json"


@dataclass
class WriteResult:
    """What a write job wrote: every shard's entry, where the manifest went, the class map (None
    for inputs without one), the shards kept from an earlier run, the files keyed other than by name."""

    shards: List[ShardInfo]
    manifest: str
    class_map: Optional[Dict[str, int]] = None
    reused: int = 0
    renamed: List[Tuple[str, str]] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes or 0 for s in self.shards)


def out_folder(pattern: str) -> str:
    return pattern.rsplit("/", 1)[0] if is_remote(pattern) else os.path.dirname(os.path.abspath(pattern))


def write_dataset(
    source: Any,
    pattern: str,
    *,
    max_count: int = 1000,
    max_size: Optional[int] = None,
    shuffle: bool = True,
    seed: int = 0,
    engine: str = "local",
    processes: Optional[int] = None,
    ray_address: Optional[str] = None,
    tasks: Optional[int] = None,
    columns: Optional[str] = None,
    window: Optional[int] = None,
    class_map: Optional[Dict[str, int]] = None,
    numeric_classes: bool = False,
    numbered_keys: bool = False,
    manifest: Optional[str] = None,
    storage: StorageOptions = DEFAULT_STORAGE,
    progress: bool = False,
) -> WriteResult:
    """Write ``source`` (an ImageFolder tree, a file list, Parquet files or a folder of them: local
    or remote; or a Ray Dataset) into shards named by ``pattern`` (``out/train-%06d.tar``, local
    or ``s3://...``), with their manifest (``manifest``, default ``manifest.json`` beside them),
    on ``engine`` ``"local"`` (``processes``) or ``"ray"`` (``ray_address``), in ``tasks`` tasks
    (default: one per shard; per window for blocks). Shards of an earlier run of the same job are
    kept (``reused``). See ``dali-shards write --help`` for the rest."""
    _check(pattern, max_count, max_size, engine, processes, ray_address, tasks)
    found = find_input(source, class_map=class_map, numeric=numeric_classes, columns=columns,
                       numbered_keys=numbered_keys, storage=storage)  # fmt: skip
    if isinstance(getattr(found, "reader", None), RayReader) and engine != "ray":
        raise ConfigError("a Ray Dataset as input needs engine='ray' (its blocks are in Ray's object store)")
    shards, groups = _plan(found, pattern, max_count, max_size, shuffle, seed, window, storage)
    folder = out_folder(pattern)
    target = Target(f"{folder}/{PARTS}", storage)
    kept = kept_fragments(shards, target.parts, folder, storage)
    created = not is_remote(folder) and not os.path.exists(folder)
    if not is_remote(folder):
        os.makedirs(target.parts, exist_ok=True)
    work = _tasks(groups, kept, tasks, target, seed, shuffle, found)
    spool = Spool([s.url for s in shards], manifest or f"{folder}/{MANIFEST_NAME}")
    try:
        for number, fragment in kept.items():
            spool.add(number, fragment)
        if work:
            runner = make_engine(engine, processes, ray_address)
            try:
                _run(runner, work, spool, sum(s.samples for s in shards), len(shards), len(kept), progress)
            finally:
                runner.close()
        result = _finish(found, spool, folder, len(kept), storage)
    except BaseException:
        _left(folder, target.parts, created)
        raise
    finally:
        spool.close()
    clean(target.parts, folder, storage)
    return result


def _check(pattern: str, max_count: int, max_size: Optional[int], engine: str, processes: Optional[int],
           address: Optional[str], tasks: Optional[int]) -> None:  # fmt: skip
    """The options' ConfigErrors, before the input is read (and Ray's absence said)."""
    layout.check_options(pattern, max_count, max_size)
    check_engine(engine, processes, address)
    if tasks is not None and tasks < 1:
        raise ConfigError(f"tasks must be at least 1, got {tasks}")


def _finish(found: Any, spool: Spool, folder: str, kept: int, storage: StorageOptions) -> WriteResult:
    """The class map, then the manifest (last): what the job wrote."""
    result = WriteResult([], spool.manifest, getattr(found, "class_map", None), kept, getattr(found, "renamed", []))
    if result.class_map is not None:
        from dali_shards.tools.imagefolder import save_class_map

        save_class_map(f"{folder}/classes.json", result.class_map, storage)
    result.shards = spool.merge(storage)
    return result


def _plan(found: Any, pattern: str, max_count: int, max_size: Optional[int], shuffle: bool, seed: int,
          window: Optional[int], storage: StorageOptions) -> Tuple[List[Any], List[Any]]:  # fmt: skip
    """The shards, and what one task may take at most: single shards, or a window's shards."""
    if isinstance(found, FilesInput):
        given = _sized(found.files, storage) if max_size is not None else found.files
        files = layout.file_shards(given, pattern, max_count=max_count, max_size=max_size, shuffle=shuffle,
                                   seed=seed, keys=found.keys, size_of=lambda f: f.size or 0)  # fmt: skip
        return files, [[s] for s in files]
    assert isinstance(found, BlocksInput)
    if max_size is not None:
        raise ConfigError("--max-size needs every sample's size before writing, which Parquet rows of bytes and Ray "
                          "Datasets do not tell: use --max-count")  # fmt: skip
    windows = layout.windows_of(found.blocks, found.rows, window or 8 * max_count, shuffle, seed)
    width = layout.key_width(sum(found.rows))
    recipe = layout.recipe_of(seed, shuffle, sorted(found.columns.items()), width, max_count)
    cut = layout.block_shards(windows, pattern, max_count, recipe)
    if not cut:
        raise ConfigError("the input holds no rows to write")
    by_window: Dict[int, List[Any]] = {}
    for s in cut:
        by_window.setdefault(s.window.index, []).append(s)
    return cut, [by_window[w.index] for w in windows if w.index in by_window]


def _sized(files: List[Any], storage: StorageOptions) -> List[Any]:
    """``files`` with their sizes, those not known yet asked for 16 at a time (``max_size`` needs them)."""
    unknown = [i for i, f in enumerate(files) if f.size is None]
    if not unknown:
        return files
    with ThreadPoolExecutor(max_workers=16) as pool:
        sizes = list(pool.map(lambda i: input_size(files[i].path, storage), unknown))
    out = list(files)
    for i, size in zip(unknown, sizes):
        out[i] = out[i]._replace(size=size)
    return out


def _tasks(groups: List[List[Any]], kept: Dict[int, Any], tasks: Optional[int], target: Target, seed: int,
           shuffle: bool, found: Any) -> List[Any]:  # fmt: skip
    """The engine's tasks: the groups left to write (a group: shards one task must write together),
    dealt into ``tasks`` runs of consecutive groups (default: one task per group)."""
    left = [[s for s in g if s.number not in kept] for g in groups]
    left = [g for g in left if g]
    runs = _split(left, tasks or len(left))
    if isinstance(found, FilesInput):
        return [(target, tuple(s for g in run for s in g)) for run in runs]
    width = layout.key_width(sum(found.rows))
    return [[WindowTask(target, found.reader, g[0].window, tuple(g), seed, shuffle, width) for g in run]
            for run in runs]  # fmt: skip


def _split(items: Sequence[Any], parts: int) -> List[List[Any]]:
    """``items`` in ``parts`` runs of consecutive items (sizes differing by one at most)."""
    parts = max(1, min(parts, len(items)))
    q, r = divmod(len(items), parts)
    out, at = [], 0
    for i in range(parts):
        n = q + (i < r)
        out.append(list(items[at : at + n]))
        at += n
    return [o for o in out if o]


def _run(runner: Engine, work: List[Any], spool: Spool, samples: int, shards: int, kept: int, progress: bool) -> None:
    """Run the tasks, every fragment into the spool; one progress line (samples, shards, bytes/s)."""
    done_samples = sum(e.samples for e in spool.entries.values())
    bar = tqdm(total=samples, initial=done_samples, unit="sample", disable=not progress, desc="writing shards")
    start, written = time.monotonic(), 0
    try:
        for _, fragments in runner.run(run_tasks, work):
            for fragment in fragments:
                info = spool.add(spool.names[fragment["url"]], fragment)
                written += info.bytes or 0
                bar.update(info.samples)
            rate = written / max(time.monotonic() - start, 1e-9)
            bar.set_postfix_str(f"{len(spool.entries)}/{shards} shards ({kept} kept), {rate / 1e6:.1f} MB/s")
    finally:
        bar.close()


def run_tasks(task: Any) -> List[Any]:
    """One engine task: a file task, or windows in turn."""
    if isinstance(task, list):
        return [f for window in task for f in run_task(window)]
    return run_task(task)


def _left(folder: str, parts: str, created: bool) -> None:
    """After a failure: complete shards stay for a re-run (said once); with none, nothing stays."""
    if is_remote(folder):
        return
    complete = [n for n in os.listdir(parts) if n.endswith(".json")] if os.path.isdir(parts) else []
    if complete:
        log.warning("dali_shards: %d complete shards are kept in %s: run the same write again to complete the "
                    "job (they are checked and kept)", len(complete), folder)  # fmt: skip
        return
    clean(parts, folder, DEFAULT_STORAGE)
    if created:
        shutil.rmtree(folder, ignore_errors=True)
