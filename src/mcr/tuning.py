"""Tuning tables: which backend ``backend="auto"`` runs each operation on.

A tuning table records, for each collective, buffer device and message size,
the latency ``python -m mcr.tune`` measured on every backend, and the backend
chosen there (the fastest). It is a JSON file (format ``mcr-tuning``,
version 1; the schema is on the docs' "Tuning" page)::

    {"format": "mcr-tuning", "version": 1,
     "machine": {"host": "node1", "mpi": "Open MPI v5.0.11", "torch": "2.13.0",
                 "world_size": 2, "ppn": 2, "devices": ["cpu"]},
     "entries": [{"op": "Allreduce", "device": "cpu", "bytes": 4,
                  "min_bytes": 0, "max_bytes": 4, "backend": "mpi",
                  "latency_us": {"mpi": 3.1, "gloo": 48.0}}, ...]}

An entry covers the sizes above the previous entry's ``bytes`` (of the same
operation and device) up to its own; the last one also covers every larger
size. Sizes are those of :mod:`mcr.bench.ops`: the bytes each process
contributes (``Allreduce``: the vector; ``Allgather``, ``Gather``,
``Alltoall``: one block; ``Reduce_scatter``: the whole vector). Where ranks
see different sizes (``Gatherv``, ``Scatterv``, ``Alltoallv``) and for
``Barrier``, one backend serves every size: the one with the smallest
geometric mean of latencies over the sizes measured, written in each of
its entries (if they differ, the largest size's entry decides). Point-to-point under auto
always runs on MPI (the sender and receiver see different buffers and must
take the same backend), and so does ``Alltoallw``.

Where the table comes from, for a communicator of ``P`` processes:
``$MCR_TUNING`` if set; else the table ``mcr.tune`` saved for this host and
``P`` in the cache (:func:`cache_path`); else the built-in defaults (MPI for
host memory, NCCL for CUDA tensors where torch has it).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORMAT", "VERSION", "OPS", "FIXED_OPS", "DEVICES", "TuningError", "Entry",
           "Table", "cache_dir", "cache_path", "resolve", "default_backend", "plan", "agree",
           "Choice", "explain"]

FORMAT = "mcr-tuning"
VERSION = 1
MAX_BYTES = 1 << 62         # sizes above the core's 64-bit bounds are no message's
# the collectives auto chooses a backend for, in mcr's call order
OPS: tuple[str, ...] = (
    "Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather",
    "Allgatherv", "Alltoall", "Alltoallv", "Reduce", "Allreduce", "Scan", "Exscan",
    "Reduce_scatter_block", "Reduce_scatter")
# one backend whatever the size: ranks see different sizes, or there is none
FIXED_OPS = frozenset({"Barrier", "Gatherv", "Scatterv", "Alltoallv"})
DEVICES: tuple[str, ...] = ("cpu", "cuda")


class TuningError(ValueError):
    """A tuning table that cannot be used: unreadable, malformed, of another
    format version, or not the same on every rank of a communicator."""


@dataclass
class Entry:
    """One measured size of one operation on one device.

    ``backend`` is the fastest of ``latency_us`` (MPI on a tie); ``min_bytes``
    and ``max_bytes`` (``None``: no limit) are the sizes it covers, set by
    :meth:`Table.ranges`.
    """

    op: str
    device: str
    bytes: int
    latency_us: dict[str, float]
    backend: str = ""
    min_bytes: int = 0
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if not self.backend:
            self.backend = fastest(self.latency_us)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "device": self.device, "bytes": self.bytes,
                "min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
                "backend": self.backend,
                "latency_us": {k: round(v, 3) for k, v in sorted(self.latency_us.items())}}


def fastest(latency_us: Mapping[str, float]) -> str:
    """The backend of smallest latency; ``mpi`` wins a tie."""
    return min(latency_us, key=lambda name: (latency_us[name], name != "mpi", name))


@dataclass
class Table:
    """A tuning table: the machine it was measured on and its entries.

    ``path`` is the file it was read from (``None`` if built in memory).
    """

    machine: dict[str, Any] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)
    path: str | None = None

    # -- building -----------------------------------------------------------

    def add(self, op: str, device: str, nbytes: int, latency_us: Mapping[str, float]) -> Entry:
        """Record the latencies of one size (replacing the backends measured
        again at that size, keeping the others), choose, and recompute the
        ranges; the entry."""
        _check_op(op, "op")
        _check_device(device, "device")
        if not latency_us:
            raise ValueError(f"latency_us: no backend measured for {op} on {device} "
                             f"at {nbytes} bytes")
        for entry in self.entries:
            if (entry.op, entry.device, entry.bytes) == (op, device, nbytes):
                entry.latency_us.update(latency_us)
                entry.backend = fastest(entry.latency_us)
                break
        else:
            entry = Entry(op, device, int(nbytes), dict(latency_us))
            self.entries.append(entry)
        if op in FIXED_OPS:           # one backend for every size (see the module)
            same = [e for e in self.entries if (e.op, e.device) == (op, device)]
            choice = _fixed_choice(same)
            for e in same:
                e.backend = choice
        self.ranges()
        return entry

    def merge(self, other: Table) -> None:
        """Add every entry of ``other`` (its measurements replace ours at the
        same operation, device, size and backend); take its machine."""
        for entry in other.entries:
            self.add(entry.op, entry.device, entry.bytes, entry.latency_us)
        if other.machine:
            self.machine = dict(other.machine)

    def ranges(self) -> None:
        """Sort the entries and set the sizes each covers."""
        self.entries.sort(key=lambda e: (OPS.index(e.op), DEVICES.index(e.device), e.bytes))
        previous: Entry | None = None
        for entry in self.entries:
            same = previous is not None and (previous.op, previous.device) == (entry.op,
                                                                                entry.device)
            entry.min_bytes = previous.bytes + 1 if same and previous is not None else 0
            if same and previous is not None:
                previous.max_bytes = previous.bytes
            entry.max_bytes = None
            previous = entry

    # -- files ------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "machine": self.machine,
                "entries": [e.to_json() for e in self.entries]}

    def save(self, path: str) -> None:
        """Write the table to ``path`` (atomically: a reader never sees half)."""
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
        self.path = path

    @classmethod
    def load(cls, path: str) -> Table:
        """Read and check a table.

        Raises
        ------
        TuningError
            If the file cannot be read or parsed, is not format ``mcr-tuning``
            version 1, or a field is missing or of the wrong kind; the message
            names the file and the field.
        """
        try:
            with open(path) as f:
                data = json.load(f)
        except OSError as exc:
            raise TuningError(f"{path}: cannot read the tuning table: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise TuningError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: "
                              f"{exc.msg})") from None
        except UnicodeDecodeError as exc:
            raise TuningError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                              f"offset {exc.start}): not a tuning table") from None
        except RecursionError:
            raise TuningError(f"{path}: JSON nested too deeply: not a tuning table") from None
        return cls.from_json(data, path)

    @classmethod
    def from_json(cls, data: Any, path: str = "<table>") -> Table:
        """A table from its parsed JSON (errors as :meth:`load`)."""
        def fail(where: str, problem: str) -> TuningError:
            return TuningError(f"{path}: {where}: {problem}")

        if not isinstance(data, dict):
            raise fail("top level", f"expected an object, got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise fail("format", f"expected {FORMAT!r}, got {data.get('format')!r}")
        if type(data.get("version")) is not int or data.get("version") != VERSION:
            raise fail("version", f"this mcr reads version {VERSION}, the file is version "
                       f"{data.get('version')!r} (run python -m mcr.tune again)")
        machine = data.get("machine", {})
        if not isinstance(machine, dict):
            raise fail("machine", f"expected an object, got {type(machine).__name__}")
        raw = data.get("entries")
        if not isinstance(raw, list):
            raise fail("entries", f"expected a list, got {type(raw).__name__}")
        table = cls(machine=machine, path=path)
        seen: set[tuple[str, str, int]] = set()
        for i, item in enumerate(raw):
            where = f"entries[{i}]"
            if not isinstance(item, dict):
                raise fail(where, f"expected an object, got {type(item).__name__}")
            op = _field(item, "op", str, where, fail)
            if op not in OPS:
                raise fail(f"{where}.op", f"{op!r} is not an operation auto chooses for "
                           f"(one of {', '.join(OPS)})")
            device = _field(item, "device", str, where, fail)
            if device not in DEVICES:
                raise fail(f"{where}.device", f"expected one of {', '.join(DEVICES)}, got "
                           f"{device!r}")
            nbytes = _field(item, "bytes", int, where, fail)
            if not 0 <= nbytes < MAX_BYTES:
                raise fail(f"{where}.bytes", f"expected a size from 0 to 2**62 - 1, got "
                           f"{nbytes}")
            latency = _field(item, "latency_us", dict, where, fail)
            if not latency:
                raise fail(f"{where}.latency_us", "no backend measured")
            for name, value in latency.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or not value >= 0:
                    raise fail(f"{where}.latency_us.{name}",
                               f"expected a latency >= 0 in us, got {value!r}")
            backend = _field(item, "backend", str, where, fail)
            if backend not in latency:
                raise fail(f"{where}.backend", f"{backend!r} has no latency in "
                           f"latency_us ({', '.join(latency)})")
            key = (op, device, nbytes)
            if key in seen:
                raise fail(where, f"a second entry for {op} on {device} at {nbytes} bytes")
            seen.add(key)
            # the file's choice stands (a user may edit it); ranges are recomputed
            table.entries.append(Entry(op, device, nbytes,
                                       {k: float(v) for k, v in latency.items()}, backend))
        table.ranges()
        return table

    def digest(self) -> str:
        """A hash of the choices (operations, devices, sizes, backends): equal
        on two ranks exactly when auto decides the same on both."""
        choices = [(e.op, e.device, e.bytes, e.backend) for e in self.entries]
        return hashlib.sha256(json.dumps(choices).encode()).hexdigest()[:16]


def _field(item: dict[str, Any], name: str, kind: type, where: str, fail: Any) -> Any:
    if name not in item:
        raise fail(f"{where}.{name}", "missing")
    value = item[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise fail(f"{where}.{name}", f"expected {kind.__name__}, got "
                   f"{type(value).__name__} {value!r}")
    return value


def _check_op(op: str, arg: str) -> None:
    if op not in OPS:
        raise ValueError(f"{arg}: {op!r} is not an operation auto chooses for "
                         f"(one of {', '.join(OPS)})")


def _check_device(device: str, arg: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"{arg}: expected one of {', '.join(DEVICES)}, got {device!r}")


# -- Where the table comes from ---------------------------------------------------

def cache_dir() -> str:
    """The folder of the tables ``mcr.tune`` saves by default:
    ``$XDG_CACHE_HOME/mcr/tuning`` (``~/.cache/mcr/tuning``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mcr", "tuning")


def cache_path(world_size: int, host: str | None = None) -> str:
    """The cached table of ``host`` (this one by default) for communicators
    of ``world_size`` processes."""
    return os.path.join(cache_dir(), f"{host or socket.gethostname()}-n{world_size}.json")


def resolve(size: int) -> tuple[Table | None, str]:
    """The table auto uses on a communicator of ``size`` processes, and where
    it comes from: ``$MCR_TUNING``, else the cached table for this host and
    ``size``, else ``(None, "defaults")``.

    Raises
    ------
    TuningError
        If the table named by ``$MCR_TUNING``, or the cached one, cannot be
        used (its message names the file and the field).
    """
    named = os.environ.get("MCR_TUNING")
    if named:
        if os.path.isdir(named):
            raise TuningError(f"MCR_TUNING: {named}: a folder, not a table file")
        if not os.path.isfile(named):
            raise TuningError(f"MCR_TUNING: {named}: no such file")
        return Table.load(named), named
    cached = cache_path(size)
    if os.path.isfile(cached):
        return Table.load(cached), cached
    return None, "defaults"


def default_backend(device: str) -> str:
    """The backend auto takes without a table entry: MPI for host memory,
    NCCL for CUDA tensors where torch has NCCL."""
    if device == "cuda":
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_nccl_available():
                return "nccl"
        except ImportError:
            pass
    return "mpi"


def plan(table: Table | None) -> dict[tuple[str, str], list[tuple[int | None, str]]]:
    """What auto decides, as ``{(op, device): [(max_bytes, backend), ...]}``:
    ascending upper bounds, the last ``None`` (every larger size). Operations
    and devices without entries take :func:`default_backend`."""
    chosen: dict[tuple[str, str], list[tuple[int | None, str]]] = {}
    for device in DEVICES:
        fallback = default_backend(device)
        for op in OPS:
            entries = [e for e in table.entries if (e.op, e.device) == (op, device)] \
                if table is not None else []
            if not entries:
                chosen[op, device] = [(None, fallback)]
            elif op in FIXED_OPS:         # mcr.tune writes one backend in all of them
                chosen[op, device] = [(None, entries[-1].backend)]
            else:
                bounds: list[tuple[int | None, str]] = []
                for entry in entries:
                    if bounds and bounds[-1][1] == entry.backend:
                        bounds[-1] = (entry.max_bytes, entry.backend)   # one range
                    else:
                        bounds.append((entry.max_bytes, entry.backend))
                chosen[op, device] = bounds
    return chosen


def _fixed_choice(entries: Iterable[Entry]) -> str:
    """The backend of an operation that takes one whatever the size: smallest
    geometric mean of latency over the sizes where every backend that was
    measured somewhere has a latency (MPI on a tie)."""
    entries = list(entries)
    names = sorted({name for e in entries for name in e.latency_us})
    complete = [e for e in entries if all(n in e.latency_us for n in names)]
    if not complete:                  # no size measured on all: the file's choice
        return entries[-1].backend
    means = {n: sum(math.log(max(e.latency_us[n], 1e-3)) for e in complete) / len(complete)
             for n in names}
    return fastest(means)


def agree(comm: Any, digest: str, source: str, error: Exception | None) -> None:
    """Check that every rank of ``comm`` decides from the same table
    (collective: one allgather, at the first collective under auto).

    Raises
    ------
    TuningError
        On every rank, if a rank could not use its table (naming the rank,
        the file and the field) or the ranks loaded different tables (naming
        each rank's file).
    """
    every = comm.allgather((digest, source, None if error is None else str(error)))
    failed = [(rank, problem) for rank, (_, _, problem) in enumerate(every) if problem]
    if failed:
        listed = "; ".join(f"rank {rank}: {problem}" for rank, problem in failed[:4])
        more = f" (and {len(failed) - 4} more ranks)" if len(failed) > 4 else ""
        raise TuningError(f"backend='auto': a tuning table cannot be used: {listed}{more}")
    if len({d for d, _, _ in every}) > 1:
        groups: dict[tuple[str, str], list[int]] = {}
        for rank, (d, src, _) in enumerate(every):
            groups.setdefault((d, src), []).append(rank)
        listed = "; ".join(f"{_ranks(ranks)}: {src} (choices {d})"
                           for (d, src), ranks in groups.items())
        raise TuningError("backend='auto': the ranks loaded different tuning tables, so they "
                          f"would choose different backends: {listed}. Give every rank "
                          "the same table (MCR_TUNING=FILE) or rerun python -m mcr.tune")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


@dataclass(frozen=True)
class Choice:
    """What ``backend="auto"`` runs an operation on (``Comm.choose``).

    ``entry`` is the table entry that decided (``None`` for the defaults and
    for the operations auto always runs on MPI); ``source`` the table's file,
    ``"defaults"`` or ``"fixed"``.
    """

    op: str
    device: str
    nbytes: int
    backend: str
    source: str
    entry: Entry | None
    reason: str


def explain(table: Table | None, source: str, op: str, device: str, nbytes: int,
            backend: str) -> Choice:
    """Why auto runs ``op`` of ``nbytes`` on ``device`` on ``backend`` (the
    core's decision, explained from the table it came from)."""
    def choice(entry: Entry | None, reason: str) -> Choice:
        return Choice(op, device, nbytes, backend, source, entry, reason)

    if source == "fixed":
        return choice(None, f"{op} always runs on MPI under auto (point-to-point: sender "
                            "and receiver must take the same backend; Alltoallw: only MPI "
                            "has it)")
    entries = [e for e in table.entries if (e.op, e.device) == (op, device)] \
        if table is not None else []
    if not entries:
        where = "no tuning table" if table is None else f"no entry for {op} on {device}"
        return choice(None, f"{where}: the default for {device} memory is {backend}")
    if op in FIXED_OPS:
        return choice(entries[-1], f"{op} takes one backend whatever the size (ranks see "
                                   f"different sizes, or none): {backend}, from "
                                   f"{len(entries)} measured sizes")
    entry = next(e for e in entries if e.max_bytes is None or nbytes <= e.max_bytes)
    upto = "and up" if entry.max_bytes is None else f"to {entry.max_bytes}"
    measured = ", ".join(f"{name} {us:.3g} us" for name, us in sorted(entry.latency_us.items()))
    return choice(entry, f"{op} on {device}, {nbytes} bytes: the entry measured at "
                         f"{entry.bytes} bytes (covering {entry.min_bytes} {upto}): {measured}")
