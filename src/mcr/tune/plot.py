"""The figure of a tuning table: ``python -m mcr.tune plot TABLE --out PNG``, or
``--plot PNG`` after a run (``show``: the summary, then the figure). It reads
the table only (no MPI).

One panel per operation (and device, when the table has both): the latency
of each backend against the message size, both on log scales, with the sizes
each backend is chosen for shaded in its colour. Barrier, which has no size,
is a bar per backend.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

from mcr import tuning
from mcr._outputs import save_figure

from .cli import PROG, TUNED, parse_plot_args, pyplot
from .report import backend_order, mpi_name, size_text, summary

__all__ = ["plot_table", "show", "main"]

COLOURS = {"mpi": "tab:blue", "gloo": "tab:orange", "nccl": "tab:green"}
OTHER_COLOURS = ("tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
COLUMNS = 4


def _colours(backends: Sequence[str]) -> dict[str, str]:
    others = iter(OTHER_COLOURS * (1 + len(backends)))
    return {b: COLOURS.get(b) or next(others) for b in backends}


def plot_table(table: tuning.Table, out: str) -> None:
    """Draw ``table`` into the image file ``out`` (PNG: by its extension).

    Raises
    ------
    ValueError
        When the table has no entries.
    ImportError
        When matplotlib is not installed.
    """
    panels = [(op, d) for op in tuning.OPS for d in tuning.DEVICES
              if any((e.op, e.device) == (op, d) for e in table.entries)]
    if not panels:
        raise ValueError(f"{table.path or 'table'}: no entries to plot")
    plt = pyplot()
    colours = _colours(backend_order(b for e in table.entries for b in e.latency_us))
    both = len({d for _, d in panels}) > 1
    cols = min(COLUMNS, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, (op, device) in zip(axes.flat, panels):
        entries = [e for e in table.entries if (e.op, e.device) == (op, device)]
        ax.set_title(f"{op} ({device})" if both else op, fontsize=10)
        if all(e.bytes == 0 for e in entries):
            _bars(ax, entries[-1], colours)
        else:
            _lines(ax, [e for e in entries if e.bytes > 0], colours)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], color=c, marker="o", label=b) for b, c in colours.items()]
    fig.legend(handles=handles, loc="upper right", title="backend (shade: chosen)")
    m = table.machine
    fig.suptitle(f"mcr tuning table: {m.get('world_size', '?')} ranks on "
                 f"{m.get('host', '?')} ({mpi_name(m)})", fontsize=11)
    fig.tight_layout(rect=(0, 0, 0.92, 0.95))
    save_figure(fig, out, dpi=100)
    plt.close(fig)


def _lines(ax: Any, entries: list[tuning.Entry], colours: dict[str, str]) -> None:
    """Latency per backend against size; each entry's span shaded by its choice."""
    sizes = [e.bytes for e in entries]
    # an entry's span: half-way (in log) to its neighbours
    edges = [sizes[0] / math.sqrt(2)] + [math.sqrt(a * b) for a, b in zip(sizes, sizes[1:])] \
        + [sizes[-1] * math.sqrt(2)]
    for entry, lo, hi in zip(entries, edges, edges[1:]):
        ax.axvspan(lo, hi, color=colours[entry.backend], alpha=0.15, linewidth=0)
    for backend, colour in colours.items():
        measured = [(e.bytes, e.latency_us[backend]) for e in entries
                    if backend in e.latency_us]
        if measured:
            xs, ys = zip(*measured)
            ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=backend)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per process")
    ax.set_ylabel("latency (us)")
    ticks = sizes[::max(1, len(sizes) // 5)]
    ax.set_xticks(ticks, [size_text(n) for n in ticks])
    ax.grid(True, which="major", alpha=0.3)


def _bars(ax: Any, entry: tuning.Entry, colours: dict[str, str]) -> None:
    """One bar per backend (Barrier), on the chosen backend's shade."""
    names = [b for b in colours if b in entry.latency_us]
    ax.bar(names, [entry.latency_us[b] for b in names], color=[colours[b] for b in names])
    ax.set_facecolor(colours[entry.backend])
    ax.patch.set_alpha(0.15)
    ax.set_yscale("log")
    ax.set_ylabel("latency (us)")


def show(table: tuning.Table, args: argparse.Namespace, path: str) -> int:
    """Print the summary of what ``args`` (the options of the run) measured and,
    with ``--plot``, draw the table; the status (1: the figure could not be
    written, which is said)."""
    measured = [(TUNED[name], d) for name in args.ops for d in args.devices]
    print("\n".join(summary(table, measured, path)), flush=True)
    if args.plot:
        try:
            plot_table(table, args.plot)
        except OSError as exc:
            print(f"{PROG}: error: --plot {args.plot}: cannot write the figure: "
                  f"{exc.strerror or exc}", file=sys.stderr, flush=True)
            return 1
        print(f"figure written to {args.plot}", flush=True)
    return 0


def main(argv: Sequence[str]) -> int:
    """``python -m mcr.tune plot TABLE --out PNG``; the exit status (1: an
    unusable table, 2: a bad option)."""
    args = parse_plot_args(argv)
    try:
        table = tuning.Table.load(args.table)
        plot_table(table, args.out)
    except (tuning.TuningError, ValueError) as exc:
        print(f"{PROG} plot: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{PROG} plot: error: --out {args.out}: cannot write the figure: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"figure written to {args.out}")
    return 0
