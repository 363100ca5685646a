"""The resume contract, checked on any sharded pipeline (as torchdata's ``run_test_save_load_state``
checks its nodes): states saved at several points of a run, on every rank, resume to exactly the
batches the uninterrupted run delivered from there (or, where the mode promises only that, as many).
Imports DALI when called."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

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
    """Every batch of ``it`` until epoch ``epochs`` begins; asserts that every epoch it ends (each
    ``StopIteration``) delivered batches: a run resumed at an epoch's end goes on with the next
    epoch's batches, not with an empty epoch."""
    out: List[Batch] = []
    while it.epoch < epochs:
        epoch, before = it.epoch, len(out)
        for (batch,) in it:
            out.append((epoch, it.step - 1, batch[index].reshape(-1).tolist()))
        assert len(out) > before, f"epoch {epoch} ended without a batch"
    return out


def uninterrupted(
    factory: Callable[..., Any], names: Sequence[str], *, world: int = 1, epochs: int = 2, index: str = "index"
) -> Tuple[Dict[int, List[Batch]], Dict[int, int]]:
    """Each rank's batches up to epoch ``epochs``, in one go (what ``check_resume`` compares a
    resumed run with), and the length (steps of the first epoch) each rank's iterator gave."""
    from dali_shards.pytorch import DALIShardedIterator

    runs, lengths = {}, {}
    for rank in range(world):
        it = DALIShardedIterator(factory(rank=rank), list(names))
        lengths[rank] = len(it)
        runs[rank] = until(it, epochs, index)
    return runs, lengths


def check_resume(
    factory: Callable[..., Any],
    names: Sequence[str],
    *,
    world: int = 1,
    stops: Sequence[Union[int, str]] = (0, 1, "mid", "end", "next"),
    epochs: int = 2,
    index: str = "index",
    exact: bool = True,
    reference: Optional[Dict[int, List[Batch]]] = None,
) -> Dict[str, Any]:
    """Run the contract on ``factory`` (a ``@sharded_pipeline`` function, called with ``rank=`` and
    ``resume_from=``): for each stop (a number of batches; ``"mid"``, ``"end"`` and ``"next"``: half
    an epoch, the epoch's last batch, one batch into the next; ``"ended"``: the epoch's last batch
    and its ``StopIteration``), every rank's state is the same, and a pipeline resumed from it (and
    a fresh iterator given it by ``load_state_dict``) delivers what the uninterrupted run delivered
    after that point, up to epoch ``epochs``, with no empty epoch. ``exact=False`` checks the number
    of batches only. ``reference``: the uninterrupted run to compare with (``uninterrupted``'s, of
    another factory: e.g. of another transfer, that must deliver the same batches); by default
    ``factory``'s own. Returns what it checked, the uninterrupted run's batches among it."""
    from dali_shards.pytorch import DALIShardedIterator

    whole = reference
    if whole is None:
        whole = uninterrupted(factory, names, world=world, epochs=epochs, index=index)[0]
    steps = sum(1 for b in whole[0] if b[0] == 0)
    named: Dict[Union[int, str], Union[int, str]] = {"mid": steps // 2, "end": steps, "ended": steps, "next": steps + 1}
    points = [named.get(s, s) for s in stops]
    for stop, point in zip(stops, points):
        states = []
        for rank in range(world):
            it = DALIShardedIterator(factory(rank=rank), list(names))
            take(it, int(point), index)
            if stop == "ended":
                try:
                    next(it)
                except StopIteration:
                    pass
                else:
                    raise AssertionError(f"rank {rank}: no StopIteration after the epoch's {point} batches")
            states.append(it.state_dict())
            del it
        assert all(s == states[0] for s in states), f"after {stop} batches the ranks' states differ"
        for rank in range(world):
            resumed = until(DALIShardedIterator(factory(rank=rank, resume_from=states[0]), list(names)), epochs, index)
            fresh = DALIShardedIterator(factory(rank=rank), list(names))
            fresh.load_state_dict(states[0])
            loaded = until(fresh, epochs, index)
            want = whole[rank][int(point):]
            for got, how in ((resumed, "resume_from"), (loaded, "load_state_dict")):
                if exact:
                    assert got == want, f"rank {rank}, {how} after {stop} batches: {got} != {want}"
                else:
                    assert len(got) == len(want), (
                        f"rank {rank}, {how} after {stop} batches: {len(got)} batches, not {len(want)}"
                    )
    return {"steps_per_epoch": steps, "stops": points, "ranks": world, "batches": whole}
