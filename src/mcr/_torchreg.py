"""How ``import mcr`` joins torch.distributed, without importing torch or MPI.

Two things happen once ``torch.distributed`` is imported (at once, when it
already is; else right after, through an import hook, so that ``import mcr``
stays as light as it is for programs that never use torch):

- the ``"mcr"`` backend is registered
  (``torch.distributed.Backend.register_backend``), its creator importing
  :mod:`mcr.distributed` only when a process group is made;
- the ``env://`` rendezvous, torch's default, learns to work without
  ``MASTER_ADDR`` inside an MPI job: under ``mpiexec`` (or once MPI is
  initialized) and with ``MASTER_ADDR`` unset, rank and size come from MPI and
  the store is bootstrapped over MPI (:mod:`mcr.backends.store`).
  A process started without ``mpiexec`` and with none of ``MASTER_ADDR``,
  ``RANK`` and ``WORLD_SIZE`` set is a world of one (MPI's singleton), as
  ``from mcr import MPI`` is there. Otherwise (``MASTER_ADDR`` set, torchrun)
  torch's own handler runs unchanged. This is what lets
  ``init_process_group("mcr")`` (or ``"gloo"``) run under ``mpiexec``, or as
  ``python prog.py``, with nothing else set; MPI is initialized there, not at
  registration;
- ``dist.monitored_barrier``, which torch runs on Gloo groups only, runs
  ``ProcessGroupMCR.monitored_barrier`` on an "mcr" group; on any other group
  torch's own function runs unchanged.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.abc
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["install"]

_TARGET = "torch.distributed"


def install() -> None:
    """Register with torch.distributed now, or when it is imported."""
    if _TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs :func:`_register` right after ``torch.distributed`` has been executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)          # one shot; the other finders find it
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            del loader.exec_module           # back to the class's own method
            _register()
        loader.exec_module = exec_module
        return spec


def _register() -> None:
    try:
        import torch.distributed as dist
        if not dist.is_available() or "mcr" in dist.Backend.backend_list:
            return
        dist.Backend.register_backend("mcr", _create, extended_api=True,
                                      devices=["cpu", "cuda"])
        # the module, not the function torch.distributed exports under its name
        handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
        env = handlers.get("env")
        if env is not None:
            handlers["env"] = _EnvOverMPI(env)
        c10d = importlib.import_module("torch.distributed.distributed_c10d")
        monitored = _MonitoredBarrier(c10d.monitored_barrier)
        for module in (c10d, dist):
            setattr(module, "monitored_barrier", monitored)
    except Exception as exc:                 # never break the program's import of torch
        warnings.warn(f"mcr: could not register the 'mcr' torch.distributed backend: "
                      f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)


def _create(opts: Any, pg_options: Any) -> Any:
    from .distributed import create
    return create(opts, pg_options)


class _MonitoredBarrier:
    """torch's ``monitored_barrier``, run by the group itself on an "mcr" group."""

    def __init__(self, torch_function: Any) -> None:
        self.torch_function = torch_function
        self.__doc__ = torch_function.__doc__
        self.__wrapped__ = torch_function

    def __call__(self, group: Any = None, timeout: Any = None,
                 wait_all_ranks: bool = False) -> Any:
        import torch.distributed as dist
        c10d = importlib.import_module("torch.distributed.distributed_c10d")
        if c10d._rank_not_in_group(group) or dist.get_backend(group) != "mcr":
            return self.torch_function(group, timeout, wait_all_ranks)
        if isinstance(timeout, (int, float)):
            timeout = datetime.timedelta(seconds=timeout)
        pg = group if group is not None else c10d._get_default_group()
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


class _EnvOverMPI:
    """torch's ``env://`` handler, with an MPI rendezvous when ``MASTER_ADDR``
    is unset inside an MPI job."""

    def __init__(self, torch_handler: Any) -> None:
        self.torch_handler = torch_handler

    def __call__(self, url: str, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
        if os.environ.get("MASTER_ADDR") or not (_in_mpi_job() or _alone(url)):
            return self.torch_handler(url, **kwargs)   # type: ignore[no-any-return]
        return _over_mpi(url, kwargs.get("timeout"))


def _alone(url: str) -> bool:
    """A process on its own: nothing says it has peers (no ``RANK`` or
    ``WORLD_SIZE``, in the environment or the URL), so it is MPI's singleton."""
    from urllib.parse import parse_qs, urlparse
    query = parse_qs(urlparse(url).query)
    return not any(os.environ.get(name) or query.get(key)
                   for key, name in (("rank", "RANK"), ("world_size", "WORLD_SIZE")))


def _in_mpi_job() -> bool:
    from .launch import launched
    if launched():
        return True
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and bool(mpi.Is_initialized()) and not mpi.Is_finalized()


def _every_rank_arrives(world: Any, timeout: datetime.timedelta | None) -> None:
    """Wait until every rank of ``world`` has called ``init_process_group``: a
    polled barrier, bounded by its ``timeout`` as torch's own store rendezvous
    is (a rank that never calls it is an error there, not a hang in MPI)."""
    import time
    arrived = world.Ibarrier()
    seconds = None if timeout is None else timeout.total_seconds()
    deadline = None if seconds is None else time.monotonic() + seconds
    pause = 1e-5
    while not arrived.Test():
        if deadline is not None and time.monotonic() > deadline:
            import torch.distributed as dist
            raise dist.DistStoreError(
                f"init_process_group: timed out after {seconds:g} s (its "
                f"timeout) waiting for every rank of the MPI job ({world.Get_size()}) to "
                f"call it; rank {world.Get_rank()} has")
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def _over_mpi(url: str, timeout: datetime.timedelta | None = None
              ) -> Iterator[tuple[Any, int, int]]:
    from urllib.parse import parse_qs, urlparse

    from mpi4py import MPI

    from .backends.store import rendezvous
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    query = parse_qs(urlparse(url).query)
    given = {"rank": rank, "world_size": size}
    for key, name in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
        value = query.get(key, [os.environ.get(name)])[0]
        if value not in (None, "", "-1") and int(value) != given[key]:
            raise ValueError(f"init_process_group: {key}={value} was given, but MPI says "
                             f"rank {rank} of {size} (inside an MPI job without "
                             f"MASTER_ADDR, torch's ranks are MPI's)")
    _every_rank_arrives(world, timeout)
    yield rendezvous(world), rank, size
    raise RuntimeError("env:// over MPI: cannot rendezvous a second time")
