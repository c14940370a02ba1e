"""What a tuning run prints at its end: per operation and size range, the
backend the table chooses and the latency each backend measured there
(:func:`mcr.tune.plot.show` prints it, and draws the figure with ``--plot``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mcr import tuning

__all__ = ["summary", "backend_order", "size_text", "mpi_name"]


def size_text(nbytes: int) -> str:
    """``nbytes`` in the shortest exact unit: ``64``, ``4K``, ``1M``."""
    for unit, shift in (("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


def backend_order(names: Iterable[str]) -> list[str]:
    """Backend names, the built-in ones first in mcr's order (mpi, gloo, nccl)."""
    builtins = ("mpi", "gloo", "nccl")
    found = set(names)
    return [b for b in builtins if b in found] + sorted(found - set(builtins))


def mpi_name(machine: dict[str, Any]) -> str:
    """The MPI library of a table's machine block, up to the first comma
    (``Open MPI v5.0.11``)."""
    return str(machine.get("mpi", "?")).split(",")[0]


def _span(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}..{hi:.1f}"


def _ranges(entries: list[tuning.Entry]) -> list[list[tuning.Entry]]:
    """Consecutive entries of one operation and device with the same backend."""
    runs: list[list[tuning.Entry]] = []
    for entry in entries:
        if runs and runs[-1][-1].backend == entry.backend:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def summary(table: tuning.Table, measured: Iterable[tuple[str, str]], path: str) -> list[str]:
    """The lines of the end-of-run summary.

    Parameters
    ----------
    table : mcr.tuning.Table
        The table as written.
    measured : iterable of (str, str)
        The (MPI operation name, device) pairs this run measured.
    path : str
        Where the table was written.
    """
    wanted = set(measured)
    entries = [e for e in table.entries if (e.op, e.device) in wanted]
    backends = backend_order(b for e in entries for b in e.latency_us)
    m = table.machine
    lines = [f"Tuning table: {m.get('world_size', '?')} ranks, {m.get('ppn', '?')} per node, "
             f"on {m.get('host', '?')} ({mpi_name(m)}, torch {m.get('torch', '?')}).",
             "Per operation and size range (bytes per process): the backend chosen and the "
             "latency of each backend in us (min..max over the range); "
             "'*': one backend for every size."]
    head = f"{'operation':<22}{'device':<8}{'bytes':<16}{'chosen':<8}" + "".join(
        f"{b:<16}" for b in backends)
    lines += [head, "-" * len(head.rstrip())]
    for op in tuning.OPS:
        for device in tuning.DEVICES:
            mine = [e for e in entries if (e.op, e.device) == (op, device)]
            for run in _ranges(mine):
                first, last = run[0].bytes, run[-1].bytes
                sizes = size_text(first) if first == last else \
                    f"{size_text(first)}..{size_text(last)}"
                if op in tuning.FIXED_OPS:
                    sizes += " *"
                cells = "".join(
                    f"{_span([e.latency_us[b] for e in run if b in e.latency_us]):<16}"
                    if any(b in e.latency_us for e in run) else f"{'-':<16}"
                    for b in backends)
                lines.append(f"{op:<22}{device:<8}{sizes:<16}{run[0].backend:<8}{cells}"
                             .rstrip())
    lines.append(f"table written to {path} ({len(table.entries)} entries)")
    return lines
