"""The iterator's place saved and restored with Orbax, beside the model: ``CheckpointSave(it)`` and
``CheckpointRestore(it)`` are Orbax checkpoint arguments (``ocp.args.Composite(..., loader=...)``)
handled by ``CheckpointHandler``. Each process writes its own state (``process_<i>-of-<n>.json``:
the ranks' states differ in the samples their DALI operators failed on); a restore under the same
number of processes reads its own, and under another (an elastic resume) joins them all
(``merge_rank_states``) and resumes the rest of the epoch over the new processes."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Dict, Optional

import jax
import orbax.checkpoint as ocp
from etils import epath

from dali_shards.errors import ConfigError
from dali_shards.plan.statecheck import merge_rank_states

_FILE = re.compile(r"process_(\d+)-of-(\d+)\.json")


def state_file(index: int, count: int) -> str:
    """The name of process ``index`` of ``count``'s state in a checkpoint's item folder."""
    return f"process_{index}-of-{count}.json"


def saved_state(directory: epath.Path, index: int, count: int) -> Dict[str, Any]:
    """The state process ``index`` of ``count`` resumes from: its own where the checkpoint was saved by
    ``count`` processes, else every saved process's joined; a ConfigError where there is none."""
    own = directory / state_file(index, count)
    if own.exists():
        return json.loads(own.read_text())
    saved: Dict[int, Dict[int, epath.Path]] = {}
    for path in directory.iterdir():
        found = _FILE.fullmatch(path.name)
        if found:
            saved.setdefault(int(found.group(2)), {})[int(found.group(1))] = path
    if len(saved) != 1 or sorted(next(iter(saved.values()))) != list(range(next(iter(saved)))):
        raise ConfigError(
            f"{directory} holds no complete set of dali_shards iterator states (found "
            f"{sorted(p.name for p in directory.iterdir())}): restore a checkpoint saved with CheckpointSave"
        )
    ((_, files),) = saved.items()
    return merge_rank_states([json.loads(files[i].read_text()) for i in sorted(files)])


class CheckpointHandler(ocp.CheckpointHandler):
    """Orbax's handler for a ``dali_shards.jax.DALIShardedIterator`` (or any object with
    ``state_dict()`` / ``load_state_dict()``): saves each process's state, restores it in place."""

    def save(self, directory: epath.Path, item: Optional[Any] = None, args: Optional["CheckpointSave"] = None) -> None:
        iterator = args.item if args is not None else item
        if iterator is None:
            raise ConfigError("CheckpointHandler.save needs the iterator: args=CheckpointSave(iterator)")
        path = epath.Path(directory) / state_file(jax.process_index(), jax.process_count())
        path.write_text(json.dumps(iterator.state_dict()))

    def restore(self, directory: epath.Path, item: Optional[Any] = None, args: Optional["CheckpointRestore"] = None) -> Any:
        iterator = args.item if args is not None else item
        if iterator is None:
            raise ConfigError("CheckpointHandler.restore needs the iterator to resume: args=CheckpointRestore(iterator)")
        state = saved_state(epath.Path(directory), jax.process_index(), jax.process_count())
        iterator.load_state_dict(state)
        return iterator


@ocp.args.register_with_handler(CheckpointHandler, for_save=True)
@dataclasses.dataclass
class CheckpointSave(ocp.args.CheckpointArgs):
    """Save ``item``'s place (a ``DALIShardedIterator``) with the checkpoint."""

    item: Any


@ocp.args.register_with_handler(CheckpointHandler, for_restore=True)
@dataclasses.dataclass
class CheckpointRestore(ocp.args.CheckpointArgs):
    """Restore ``item``'s place (a ``DALIShardedIterator``, resumed in place) from the checkpoint."""

    item: Any
