"""The logger's summary: per (operation, backend, message size), the number
of calls, their total and average latency, and bandwidth as nccl-tests
reports it (algorithm bandwidth, and bus bandwidth with its factors)."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["BUS_FACTORS", "bus_factor", "format_stragglers", "format_summary", "rows",
           "rows_from_records", "stragglers"]

# nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md there), by the
# operation's size n of communicator: what each process moves through its
# busiest link, relative to the message size
BUS_FACTORS: dict[str, str] = {
    "Allreduce": "2(n-1)/n",
    "Reduce_scatter": "(n-1)/n", "Reduce_scatter_block": "(n-1)/n",
    "Allgather": "(n-1)/n", "Allgatherv": "(n-1)/n",
    "Alltoall": "(n-1)/n", "Alltoallv": "(n-1)/n", "Alltoallw": "(n-1)/n",
    "Gather": "(n-1)/n", "Gatherv": "(n-1)/n", "Scatter": "(n-1)/n", "Scatterv": "(n-1)/n",
}


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for ``op`` on ``n``
    processes (1 for broadcast, reduce, scan and point-to-point)."""
    rule = BUS_FACTORS.get(op)
    if rule is None or n <= 1:
        return 1.0 if rule is None else 0.0
    return (2.0 if rule.startswith("2") else 1.0) * (n - 1) / n


Key = tuple[str, str, int, int]          # (op, backend, bytes, comm size)
Totals = Mapping[Key, tuple[int, int, int, int, int]]


def rows(totals: Totals) -> list[dict[str, Any]]:
    """Summary rows from the core's totals ``{(op, backend, bytes, size):
    (calls, total ns, min ns, max ns, wire bytes)}``, by operation, backend
    and size."""
    out = []
    for (op, backend, nbytes, size), (calls, total, low, high, wire) in sorted(totals.items()):
        avg_ns = total / calls if calls else 0.0
        algbw = nbytes / avg_ns if avg_ns > 0 else 0.0          # bytes/ns = GB/s
        out.append({
            "op": op, "backend": backend, "bytes": nbytes, "procs": size, "calls": calls,
            "total_us": total / 1e3, "avg_us": avg_ns / 1e3, "min_us": low / 1e3,
            "max_us": high / 1e3, "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(op, size),
            "wire_bytes": wire})
    return out


def rows_from_records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Summary rows from logged records (dicts of ``mcr.log.records()`` or a
    JSON log)."""
    totals: dict[Key, list[int]] = {}
    for r in records:
        key = (r["op"], r["backend"], r["bytes"], r["procs"])
        t = round(r["duration_us"] * 1e3)
        acc = totals.setdefault(key, [0, 0, t, t, 0])
        acc[0] += 1
        acc[1] += t
        acc[2] = min(acc[2], t)
        acc[3] = max(acc[3], t)
        acc[4] += r["wire_bytes"]
    return rows({k: (v[0], v[1], v[2], v[3], v[4]) for k, v in totals.items()})


def size_str(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def format_summary(summary_rows: Sequence[Mapping[str, Any]], title: str = "") -> str:
    """The summary as a text table (the one ``MCR_LOG=summary`` prints)."""
    head = ("op", "backend", "size", "procs", "calls", "total ms", "avg us", "min us",
            "max us", "algbw GB/s", "busbw GB/s", "wire")
    lines = [[r["op"], r["backend"], size_str(r["bytes"]), str(r["procs"]), str(r["calls"]),
              f"{r['total_us'] / 1e3:.3f}", f"{r['avg_us']:.2f}", f"{r['min_us']:.2f}",
              f"{r['max_us']:.2f}", f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}",
              size_str(r["wire_bytes"] // max(r["calls"], 1))] for r in summary_rows]
    return _table(head, lines, title or "mcr communication summary",
                  "(no calls logged)" if not lines else "")


def stragglers(per_rank: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per (op, backend, size), the average latency's minimum and maximum
    over ranks, and the slowest rank, from every rank's summary rows (in
    rank order)."""
    seen: dict[tuple[str, str, int], list[tuple[float, int, int]]] = {}
    for rank, rank_rows in enumerate(per_rank):
        for r in rank_rows:
            seen.setdefault((r["op"], r["backend"], r["bytes"]), []).append(
                (r["avg_us"], rank, r["calls"]))
    out = []
    for (op, backend, nbytes), values in sorted(seen.items()):
        low = min(values)
        high = max(values)
        out.append({"op": op, "backend": backend, "bytes": nbytes, "ranks": len(values),
                    "min_avg_us": low[0], "max_avg_us": high[0], "slowest_rank": high[1],
                    "spread": high[0] / low[0] if low[0] > 0 else 0.0})
    return out


def format_stragglers(straggler_rows: Sequence[Mapping[str, Any]]) -> str:
    """The cross-rank table of ``stragglers`` as text."""
    head = ("op", "backend", "size", "ranks", "min avg us", "max avg us", "slowest", "max/min")
    lines = [[r["op"], r["backend"], size_str(r["bytes"]), str(r["ranks"]),
              f"{r['min_avg_us']:.2f}", f"{r['max_avg_us']:.2f}", str(r["slowest_rank"]),
              f"{r['spread']:.2f}"] for r in straggler_rows]
    return _table(head, lines, "mcr stragglers (average latency over ranks)",
                  "(no calls logged)" if not lines else "")


def _table(head: Sequence[str], lines: Sequence[Sequence[str]], title: str, empty: str) -> str:
    widths = [max([len(h)] + [len(row[i]) for row in lines]) for i, h in enumerate(head)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [title, fmt(head), fmt(["-" * w for w in widths])]
    out += [fmt(row) for row in lines]
    if empty:
        out.append(empty)
    return "\n".join(out)
