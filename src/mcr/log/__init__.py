"""The communication logger: what every call of every communicator costs.

Off by default, and then free (the call path tests one flag). Turned on by
the environment variable ``MCR_LOG`` or from code::

    MCR_LOG=summary mpiexec -n 4 python train.py          # a table at exit (rank 0)
    MCR_LOG=summary:ranks ...                             # every rank's table
    MCR_LOG=summary:stragglers ...                        # + min/max over ranks
    MCR_LOG=json:calls.jsonl ...                          # one record per call
    MCR_LOG=trace:trace.json ...                          # Perfetto, Chrome DevTools
    MCR_LOG=summary,trace:trace.json ...                  # several, comma-separated

    import mcr.log
    mcr.log.start()
    ...
    table = mcr.log.summary()     # a dict; mcr.log.format_summary(table) prints it
    mcr.log.stop()

A record is made per call: its operation, form (blocking, non-blocking,
persistent), backend (for ``backend="auto"``, the table entry that chose
it), message size, bytes on the wire, element type, count, root or peer,
tag, and the times it was posted and completed. A blocking call completes
when it returns; a non-blocking one when ``Wait``, ``Test`` or a
``Request`` class method reports it; a persistent one at each ``Start``
and its completion. Timing never synchronizes: the host clock is read at
post and completion, and calls on CUDA buffers are timed by CUDA events
recorded on the current stream (read once they have run, never by a device
synchronization). mcr's own private communicators (those of compression and
fusion) are not logged; the call that uses them is, with its bytes on the
wire.

The JSON log and the trace are written at exit by rank 0, from every rank's
records (gathered over ``COMM_WORLD``; if MPI is not running then, each rank
writes its own file, suffixed with its rank). ``python -m mcr.log plot FILE``
draws one; ``python -m mcr.log summary FILE`` prints its table.
"""

import atexit
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from .config import Config
from .output import as_dict, read_json, trace_events, write_json, write_trace
from .report import bus_factor, format_stragglers, format_summary, rows, rows_from_records
from .report import stragglers as _cross_rank

__all__ = ["Config", "active", "bus_factor", "format_stragglers", "format_summary",
           "read_json", "records", "reset", "rows_from_records", "start", "stop", "summary",
           "trace_events", "write_json", "write_trace"]


class _Sink:
    """What the core hands finished records to (in batches, when they are
    kept), and the timer of calls on CUDA buffers."""

    def __init__(self) -> None:
        self.kept: list[Any] = []
        self.cuda_pending: list[Any] = []

    def take(self, batch: list[Any]) -> None:
        self.kept.extend(batch)

    def cuda_post(self, rec: Any) -> Any:
        import torch
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()                 # on the current stream: no synchronization
        return start

    def cuda_done(self, rec: Any) -> None:
        import torch
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end.record()
        rec.cuda = (rec.cuda, end)
        self.cuda_pending.append(rec)

    def settle(self, block: bool) -> None:
        """Finish the CUDA records whose events have run (``block``: wait for
        each end event, not for the device)."""
        pending, self.cuda_pending = self.cuda_pending, []
        for rec in pending:
            start, end = rec.cuda
            if not block and not end.query():
                self.cuda_pending.append(rec)
                continue
            end.synchronize()
            rec.t1 = rec.t0 + round(start.elapsed_time(end) * 1e6)
            _core()._log_finish(rec)


_sink = _Sink()
_on = False
_keep = False
_env_done = False
_offset_ns: int | None = None
_world_seen = (0, 1)         # COMM_WORLD's (rank, size), for after the program finalizes MPI


def _core() -> ModuleType:
    # imported when used: ``import mcr`` reads MCR_LOG without loading MPI
    from mcr import _core as core
    return core


def _clock_offset_ns() -> int:
    """The logger's clock (CLOCK_MONOTONIC) to Unix time, for records of
    several hosts."""
    global _offset_ns
    if _offset_ns is None:
        _offset_ns = time.time_ns() - _core()._log_now()
    return _offset_ns


def start(records: bool = False) -> None:
    """Start logging every call (totals accumulate across start/stop until
    ``reset``).

    Parameters
    ----------
    records : bool
        Keep every record (for ``records()``, a JSON log or a trace), not only
        the per-size totals of ``summary()``.
    """
    global _on, _keep
    _on, _keep = True, _keep or bool(records)
    _core()._log_set(True, _keep, _sink)
    _world()            # remember the rank and size while MPI surely runs (the core is loaded)


def stop() -> None:
    """Stop logging; what was logged stays until ``reset``. Calls still in
    flight are recorded when they complete only while logging is on."""
    global _on
    _on = False
    _core()._log_set(False, _keep, _sink)


def active() -> bool:
    """Whether the logger is on."""
    return _on


def reset() -> None:
    """Forget everything logged so far."""
    _core()._log_reset()
    _sink.kept.clear()
    _sink.cuda_pending.clear()


def _comm_names() -> dict[int, str]:
    from mcr._core import COMM_SELF, COMM_WORLD
    return {COMM_WORLD.handle: "world", COMM_SELF.handle: "self"}


def _world() -> tuple[int, int, bool]:
    """(rank, size, whether MPI is running) of COMM_WORLD; once MPI is finalized, the
    rank and size seen last (at ``start`` at the latest), so each rank still writes
    its own file and labels its table."""
    global _world_seen
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return *_world_seen, False
    _world_seen = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return *_world_seen, True


def records() -> list[dict[str, Any]]:
    """This rank's records, as dicts, when they are kept (``start(records=True)``,
    or ``json``/``trace`` in ``MCR_LOG``); empty otherwise."""
    _sink.settle(block=True)
    _sink.take(_core()._log_take())
    rank = _world()[0]
    names = _comm_names()
    whys: dict[tuple[Any, ...], str] = {}
    return [as_dict(r, rank, names, _clock_offset_ns(), whys) for r in _sink.kept]


def summary(stragglers: bool = False, comm: Any = None) -> dict[str, Any]:
    """This rank's totals per (operation, backend, message size).

    Parameters
    ----------
    stragglers : bool
        Also compare the ranks (collective over `comm`: every rank must call
        it): per row, the minimum and maximum average latency over ranks and
        the slowest rank.
    comm : mcr.Comm, optional
        The ranks to compare (default ``COMM_WORLD``).

    Returns
    -------
    dict
        ``rank``, ``size`` (of ``COMM_WORLD``) and ``rows``: one dict per
        (op, backend, bytes) with ``procs``, ``calls``, ``total_us``,
        ``avg_us``, ``min_us``, ``max_us``, ``algbw_GBps``, ``busbw_GBps``
        (nccl-tests' factors) and ``wire_bytes``; with `stragglers`, also
        ``stragglers``: the cross-rank rows.
    """
    _sink.settle(block=True)
    rank, size, _ = _world()
    out: dict[str, Any] = {"rank": rank, "size": size, "rows": rows(_core()._log_totals())}
    if stragglers:
        if comm is None:
            from mcr._core import COMM_WORLD as comm
        out["stragglers"] = _cross_rank(comm.allgather(out["rows"]))
    return out


def _at_exit(cfg: Config) -> None:
    """Write what MCR_LOG asked for (registered when it is set)."""
    if not _on and not _keep and not _core()._log_totals():
        return
    _sink.settle(block=True)
    stop()
    rank, size, running = _world()
    collective = running and size > 1
    if cfg.summary:
        table = summary(stragglers=cfg.stragglers and collective)
        if cfg.ranks or rank == 0:
            title = f"mcr communication summary (rank {rank} of {size})"
            text = format_summary(table["rows"], title)
            if "stragglers" in table and rank == 0:
                text += "\n\n" + format_stragglers(table["stragglers"])
            print(text, file=sys.stdout, flush=True)
    if cfg.keep:
        mine = records()
        everyone: Sequence[dict[str, Any]] = mine
        suffix = ""
        if collective:
            from mcr._core import COMM_WORLD
            gathered = COMM_WORLD.gather(mine, root=0)
            if rank != 0 or gathered is None:
                return
            everyone = [r for part in gathered for r in part]
        elif size > 1:
            suffix = f".{rank}"      # MPI is gone: each rank writes its own
        for path, write in ((cfg.json, write_json), (cfg.trace, write_trace)):
            if path is not None:
                try:
                    write(path + suffix, everyone)
                except OSError as exc:    # (checked at import: removed or made read-only since)
                    print(f"mcr.log: MCR_LOG: cannot write {path + suffix}: {exc.strerror}",
                          file=sys.stderr, flush=True)


def _from_env() -> None:
    """Start logging as ``MCR_LOG`` asks (when the core loads; once)."""
    global _env_done
    if _env_done:
        return
    _env_done = True
    cfg = Config.from_env()
    if cfg is not None:
        start(records=cfg.keep)
        atexit.register(_at_exit, cfg)
