"""What an engine does: run one picklable function over a list of tasks, handing back each task's
result as it completes; and choosing one by name (``"local"`` or ``"ray"``)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Protocol, Sequence, Tuple

from dali_shards.errors import ConfigError

ENGINES = ("local", "ray")


class Engine(Protocol):
    """Runs ``fn(task)`` for every task, anywhere; yields ``(index of the task, result)`` as tasks
    complete (in any order). A task's error is raised as the error it was (a dali_shards error
    stays one), after the tasks still running are cancelled."""

    workers: int  # tasks that may run at once (for splitting work)

    def run(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[Tuple[int, Any]]: ...

    def close(self) -> None: ...


def check_engine(name: str, processes: Optional[int] = None, address: Optional[str] = None) -> None:
    """A ConfigError for an unknown engine, options of another engine, or Ray not installed
    (before any work is done; nothing is started)."""
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}: choose from {', '.join(ENGINES)}")
    if name == "local" and address is not None:
        raise ConfigError("a Ray address was given with engine 'local': pass engine='ray' (--engine ray) too")
    if name == "local" and processes is not None and processes < 1:
        raise ConfigError(f"processes must be at least 1, got {processes}")
    if name == "ray" and processes is not None:
        raise ConfigError("processes (--processes) is for engine 'local'; Ray runs as many tasks as its CPUs allow")
    if name == "ray":
        from dali_shards.engines.ray_engine import import_ray

        import_ray()


def make_engine(name: str, processes: Optional[int] = None, address: Optional[str] = None) -> Engine:
    """The engine called ``name``: ``"local"`` (``processes`` processes, default all cores) or
    ``"ray"`` (the cluster at ``address``, else ``RAY_ADDRESS``, else the one ``ray start`` began on
    this machine, else a new local instance)."""
    check_engine(name, processes, address)
    if name == "local":
        from dali_shards.engines.local import LocalEngine

        return LocalEngine(processes)
    from dali_shards.engines.ray_engine import RayEngine

    return RayEngine(address)
