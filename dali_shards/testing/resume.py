"""The resume contract, checked on any sharded pipeline (as torchdata's ``run_test_save_load_state``
checks its nodes): states saved at several points of a run, on every rank, resume to exactly the
batches the uninterrupted run delivered from there (or, where the mode promises only that, as many).
Imports DALI when called."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

Batch = Tuple[int, int, List[int]]  # epoch, step, the batch's __index__ values


def take(it: Any, n: int, index: str) -> List[Batch]:
    """The next ``n`` batches of ``it`` (an epoch's end passed over, as a training loop does)."""
    out: List[Batch] = []
    while len(out) < n:
        try:
            (batch,) = next(it)
        except StopIteration:
            continue
        out.append((it.epoch, it.step - 1, batch[index].reshape(-1).tolist()))
    return out


def until(it: Any, epochs: int, index: str) -> List[Batch]:
    """Every batch of ``it`` until epoch ``epochs`` begins."""
    out: List[Batch] = []
    while it.epoch < epochs:
        epoch = it.epoch
        for (batch,) in it:
            out.append((epoch, it.step - 1, batch[index].reshape(-1).tolist()))
    return out


def check_resume(
    factory: Callable[..., Any],
    names: Sequence[str],
    *,
    world: int = 1,
    stops: Sequence[Union[int, str]] = (0, 1, "mid", "end", "next"),
    epochs: int = 2,
    index: str = "index",
    exact: bool = True,
) -> Dict[str, Any]:
    """Run the contract on ``factory`` (a ``@sharded_pipeline`` function, called with ``rank=`` and
    ``resume_from=``): for each stop (a number of batches; ``"mid"``, ``"end"`` and ``"next"``: half
    an epoch, the epoch's last batch, one batch into the next), every rank's state is the same, and a
    pipeline resumed from it (and a fresh iterator given it by ``load_state_dict``) delivers what the
    uninterrupted run delivered after that point, up to epoch ``epochs``. ``exact=False`` checks
    the number of batches only. Returns what it checked."""
    from dali_shards.pytorch import DALIShardedIterator

    whole = {rank: until(DALIShardedIterator(factory(rank=rank), list(names)), epochs, index) for rank in range(world)}
    steps = sum(1 for b in whole[0] if b[0] == 0)
    named: Dict[Union[int, str], Union[int, str]] = {"mid": steps // 2, "end": steps, "next": steps + 1}
    points = [named.get(s, s) for s in stops]
    for stop in points:
        states = []
        for rank in range(world):
            it = DALIShardedIterator(factory(rank=rank), list(names))
            take(it, int(stop), index)
            states.append(it.state_dict())
            del it
        assert all(s == states[0] for s in states), f"after {stop} batches the ranks' states differ"
        for rank in range(world):
            resumed = until(DALIShardedIterator(factory(rank=rank, resume_from=states[0]), list(names)), epochs, index)
            fresh = DALIShardedIterator(factory(rank=rank), list(names))
            fresh.load_state_dict(states[0])
            loaded = until(fresh, epochs, index)
            want = whole[rank][int(stop):]
            for got, how in ((resumed, "resume_from"), (loaded, "load_state_dict")):
                if exact:
                    assert got == want, f"rank {rank}, {how} after {stop} batches: {got} != {want}"
                else:
                    assert len(got) == len(want), f"rank {rank}, {how} after {stop} batches: {len(got)} batches, not {len(want)}"
    return {"steps_per_epoch": steps, "stops": points, "ranks": world}
