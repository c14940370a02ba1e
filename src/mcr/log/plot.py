"""A figure of a log (``python -m mcr.log plot FILE``): time per operation and
backend, the histogram of message sizes, and a timeline of the calls."""

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mcr._outputs import save_figure

__all__ = ["plot"]

_COLORS = {"mpi": "#1f77b4", "gloo": "#ff7f0e", "nccl": "#2ca02c"}


def _color(backend: str) -> str:
    return _COLORS.get(backend, "#7f7f7f")


def plot(records: Sequence[Mapping[str, Any]], out: str, title: str = "") -> None:
    """Draw the figure of ``records`` (dicts of a JSON log or a trace) into the file
    ``out``: a PNG, or the format its extension names (``.svg``, ``.pdf``, ...).

    Raises
    ------
    ValueError
        If there are no records, or matplotlib writes no format of ``out``'s extension.
    ImportError
        If matplotlib is missing (``pip install "mcr[bench]"``).
    """
    if not records:
        raise ValueError("records: the log holds no calls")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError as exc:
        raise ImportError("mcr.log plot needs matplotlib: pip install matplotlib") from exc

    fig = plt.figure(figsize=(12, 8))
    grid = fig.add_gridspec(2, 2, height_ratios=(1, 1.2))
    ax_time, ax_size, ax_line = (fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]),
                                 fig.add_subplot(grid[1, :]))

    # time per (operation, backend), summed over ranks
    totals: dict[tuple[str, str], float] = {}
    for r in records:
        key = (r["op"], r["backend"])
        totals[key] = totals.get(key, 0.0) + r["duration_us"] / 1e3
    keys = sorted(totals, key=lambda k: totals[k])
    ax_time.barh([f"{op} ({backend})" for op, backend in keys], [totals[k] for k in keys],
                 color=[_color(b) for _, b in keys])
    ax_time.set_xlabel("total time, all ranks (ms)")
    ax_time.set_title("time per operation and backend")

    # message sizes, in powers of two
    ops = sorted({r["op"] for r in records})
    sizes = [[max(r["bytes"], 1) for r in records if r["op"] == op] for op in ops]
    top = max(max(s) for s in sizes)
    bins = [2.0 ** k for k in range(0, int(math.log2(top)) + 2)]
    ax_size.hist(sizes, bins=bins, stacked=True, label=ops)
    ax_size.set_xscale("log", base=2)
    ax_size.set_xlabel("message size (bytes)")
    ax_size.set_ylabel("calls")
    ax_size.set_title("message sizes")
    ax_size.legend(fontsize="small")

    # timeline: a row per rank, a bar per call, coloured by backend
    origin = min(r["start"] for r in records)
    ranks = sorted({r["rank"] for r in records})
    for r in records:
        row = ranks.index(r["rank"])
        ax_line.broken_barh([((r["start"] - origin) * 1e3, max(r["duration_us"] / 1e3, 1e-4))],
                            (row - 0.4, 0.8), color=_color(r["backend"]))
    ax_line.set_yticks(range(len(ranks)), [f"rank {k}" for k in ranks])
    ax_line.set_xlabel("time since the first call (ms)")
    ax_line.set_title("timeline (colour: backend)")
    handles = [Rectangle((0, 0), 1, 1, color=_color(b))
               for b in sorted({r["backend"] for r in records})]
    ax_line.legend(handles, sorted({r["backend"] for r in records}), fontsize="small",
                   loc="upper right")
    fig.suptitle(title or f"mcr.log: {len(records)} calls on {len(ranks)} ranks")
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    plt.close(fig)
