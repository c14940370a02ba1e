"""What the logger writes: records as dicts, a JSON log (one record per line)
and a trace in Chrome's trace-event format (for ui.perfetto.dev, Chrome
DevTools' Performance panel and other trace viewers), a process per rank
with threads per backend."""

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["as_dict", "read_json", "trace_events", "write_json", "write_trace"]

_DEVICES = ("cpu", "cuda")


def as_dict(rec: Any, rank: int, comm_names: Mapping[int, str], clock_offset_ns: int,
            whys: dict[tuple[Any, ...], str]) -> dict[str, Any]:
    """One record of the core (``_Rec``) as the dict written to the JSON log.
    ``clock_offset_ns`` turns the logger's clock into Unix time; ``whys``
    caches the explanations of auto's choices."""
    why = None
    if rec.why is not None:
        key = (id(rec.why[0]), rec.why[1], rec.op, rec.why[2], rec.why[3], rec.backend)
        why = whys.get(key)
        if why is None:
            from mcr import tuning
            table, source, dev, nbytes = rec.why
            why = whys[key] = tuning.explain(table, source, rec.op_name, _DEVICES[dev], nbytes,
                                             rec.backend).reason
    return {
        "rank": rank, "comm": comm_names.get(rec.comm, f"comm-{rec.comm:#x}"),
        "procs": rec.size, "op": rec.op_name, "form": rec.form_name, "backend": rec.backend,
        "why": why, "bytes": rec.nbytes, "wire_bytes": rec.wire, "dtype": rec.dtype,
        "count": rec.count, "peer": None if rec.peer < 0 else rec.peer,
        "tag": None if rec.tag < 0 else rec.tag,
        "device": "cpu" if rec.device < 0 else f"cuda:{rec.device}",
        "start": (rec.t0 + clock_offset_ns) / 1e9, "end": (rec.t1 + clock_offset_ns) / 1e9,
        "duration_us": (rec.t1 - rec.t0) / 1e3}


def write_json(path: str, records: Iterable[Mapping[str, Any]]) -> int:
    """Write one JSON object per line; the number written."""
    n = 0
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")))
            f.write("\n")
            n += 1
    return n


def read_json(path: str) -> list[dict[str, Any]]:
    """The records of a JSON log (``write_json``) or of a trace
    (``write_trace``, from its events' ``args``).

    Raises
    ------
    ValueError
        If the file is neither, naming the file and the line.
    """
    with open(path) as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("{\"traceEvents\"") or stripped.startswith("{ \"traceEvents\""):
        events = json.loads(text)["traceEvents"]
        return [e["args"]["record"] for e in events if e.get("ph") in ("X", "b")
                and "record" in e.get("args", {})]
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not a JSON record ({exc.msg})") from None
        if not isinstance(r, dict) or "op" not in r or "duration_us" not in r:
            raise ValueError(f"{path}:{lineno}: not an mcr log record (expected an object "
                             "with 'op' and 'duration_us')")
        out.append(r)
    return out


def _lanes(records: Sequence[Mapping[str, Any]]) -> list[int]:
    """For each record, its lane among the requests (non-blocking and
    persistent calls) of its rank and backend: the first lane free at its
    start, so that the calls of one lane do not overlap (0 for a blocking call)."""
    ends: dict[tuple[int, str], list[float]] = {}    # (rank, backend) -> each lane's end
    lane = [0] * len(records)
    for i in sorted(range(len(records)), key=lambda i: records[i]["start"]):
        r = records[i]
        if r["form"] == "blocking":
            continue
        free = ends.setdefault((r["rank"], r["backend"]), [])
        end = r["start"] + r["duration_us"] / 1e6
        k = next((k for k, e in enumerate(free) if e <= r["start"]), len(free))
        if k == len(free):
            free.append(end)
        else:
            free[k] = end
        lane[i] = k + 1
    return lane


def trace_events(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Trace events: a process per rank, and threads per backend. Every call
    is a complete event (``"X"``): a blocking one on its backend's thread, a
    non-blocking or persistent one (which may overlap others) on one of the
    backend's request threads ("gloo requests", "gloo requests 2", ...),
    from post to the completion the program saw. (Complete events, not async
    slices: Chrome DevTools draws only those.)"""
    if not records:
        return []
    origin = min(r["start"] for r in records)
    lane = _lanes(records)
    ranks = sorted({r["rank"] for r in records})
    # every rank has a thread for each backend of the trace, then its lanes
    keys = {(r["rank"], r["backend"], k) for r, k in zip(records, lane)}
    keys |= {(rank, backend, 0) for rank in ranks for backend in {r["backend"] for r in records}}
    tids: dict[tuple[int, str, int], int] = {}      # (rank, backend, lane) -> thread
    events: list[dict[str, Any]] = []
    for rank in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": rank,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank,
                       "args": {"sort_index": rank}})
        threads = sorted((b, k) for rk, b, k in keys if rk == rank)
        for tid, (backend, k) in enumerate(threads):
            tids[(rank, backend, k)] = tid
            name = backend if k == 0 else f"{backend} requests" + (f" {k}" if k > 1 else "")
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                           "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                           "args": {"sort_index": tid}})
    for i, r in enumerate(records):
        name = r["op"] if r["form"] == "blocking" else \
            ("I" + r["op"][0].lower() + r["op"][1:] if r["form"] == "nonblocking"
             else r["op"] + "_init")
        events.append({"ph": "X", "name": name, "cat": r["backend"], "pid": r["rank"],
                       "tid": tids[(r["rank"], r["backend"], lane[i])],
                       "ts": (r["start"] - origin) * 1e6, "dur": r["duration_us"],
                       "args": {"record": dict(r)}})
    return events


def write_trace(path: str, records: Sequence[Mapping[str, Any]]) -> int:
    """Write a trace-event JSON file; the number of records in it."""
    with open(path, "w") as f:
        json.dump({"traceEvents": trace_events(records), "displayTimeUnit": "ns",
                   "otherData": {"producer": "mcr.log"}}, f, separators=(",", ":"))
    return len(records)
