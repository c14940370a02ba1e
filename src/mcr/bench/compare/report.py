"""The report of ``python -m mcr.bench compare``: tables of the round
statistics, the ratios and targets of issue 10, and the optional figure.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import textwrap
from collections.abc import Callable
from typing import Any

from mcr._outputs import save_figure

from .cli import FORM_PEERS, FORMS, LARGE, PEERS, column, pyplot

__all__ = ["report", "summary", "targets", "plot", "columns_of", "round_stat", "row_ratios",
           "plural", "STATS"]

# Issue 10, points 3 and 4: at 2 ranks on CPU tensors, "mcr" being mcr-mpi.
# C-mt is the bar for mcr (both run at MPI_THREAD_MULTIPLE).
SMALL_BYTES = 1024
LARGE_BYTES = 1 << 20
GLOO_MAX_BYTES = 4 << 20
TARGET_MINUS_CMT_US = 0.5         # up to 1 KiB: mcr - C-mt
TARGET_CMT = 1.1                  # 1 KiB to 1 MiB: mcr / C-mt
TARGET_MPI4PY_NUMPY = 0.8         # up to 1 KiB: mcr / mpi4py-numpy
TARGET_MPI4PY_TORCH = 1 / 20
TARGET_GLOO = 1.1                 # 4 B to 4 MiB: mcr-gloo / torch-gloo
TARGET_PERSISTENT = 1.03          # "no slower", within the same 3 % noise band
TARGET_AUTO = 1.05                # issue 11: mcr-auto / the fastest mcr backend

STATS = ("min", "median")
RATIOS = ("mcr-C (us)", "mcr-Cmt (us)", "mcr/mpi4py-np", "mcr/mpi4py-pt", "mcr/C",
          "mcr/C-mt", "gloo/torch", "pers/nonpers", "C pers/nonpers", "pers/nb", "C pers/nb", "auto/best")


def round_stat(cell: dict[str, Any] | None, stat: str) -> float | None:
    if not cell or cell.get("error") or not cell.get("rounds_us"):
        return None
    rounds = cell["rounds_us"]
    return float(min(rounds) if stat == "min" else statistics.median(rounds))


def row_ratios(row: dict[str, Any], stat: str) -> dict[str, float | None]:
    """The ratios of one row (one operation and size) on one statistic."""
    def v(name: str) -> float | None:
        return round_stat(row.get(name), stat)

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    mcr, c, cmt = v("mcr-mpi"), v("C"), v("C-mt")
    return {
        "mcr-C (us)": mcr - c if mcr is not None and c is not None else None,
        "mcr-Cmt (us)": mcr - cmt if mcr is not None and cmt is not None else None,
        "mcr/mpi4py-np": div(mcr, v("mpi4py-numpy")),
        "mcr/mpi4py-pt": div(mcr, v("mpi4py-torch")),
        "mcr/C": div(mcr, c),
        "mcr/C-mt": div(mcr, cmt),
        "gloo/torch": div(v("mcr-gloo"), v("torch-gloo")),
        "pers/nonpers": div(v("mcr-mpi pers"), mcr),
        "C pers/nonpers": div(v("C pers"), c),
        "pers/nb": div(v("mcr-mpi pers"), v("mcr-mpi nb")),
        "C pers/nb": div(v("C pers"), v("C nb")),
        "auto/best": div(v("mcr-auto"), min(filter(None, (v("mcr-mpi"), v("mcr-gloo"),
                                                          v("mcr-nccl"))), default=None)),
    }


def _fmt_us(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 100 else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def _fmt_ratio(name: str, x: float | None) -> str:
    if x is None:
        return "-"
    if name.endswith("(us)"):
        return f"{x:+.2f}"
    return f"{x:.3f}" if x < 0.1 else f"{x:.2f}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fmt_bytes(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def columns_of(args: argparse.Namespace) -> list[str]:
    """The timed columns, in table order: blocking peers, then the other forms."""
    cols = [column(p, "blocking") for p in PEERS if p in args.peers]
    for form in ("persistent", "nonblocking"):
        if form in args.forms:
            cols += [column(p, form) for p in PEERS if p in args.peers and p in FORM_PEERS]
    return cols


def _cells(row: dict[str, Any], cols: list[str], stat: str, ratios: list[str]) -> list[str]:
    r = row_ratios(row, stat)
    return [_fmt_us(round_stat(row.get(c), stat)) for c in cols] + \
        [_fmt_ratio(k, r[k]) for k in ratios]


def _grid(head: list[str], body: list[list[str]], left: int = 0) -> list[str]:
    """Rows of cells in aligned columns (the first ``left`` ones left-aligned)."""
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  " + "  ".join(c.ljust(w) if i < left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths)))
            for cells in [head] + body]


def _table(op: str, rows: dict[str, Any], cols: list[str], stat: str,
           ratios: list[str]) -> list[str]:
    return _grid(["bytes"] + cols + ratios,
                 [[str(nbytes)] + _cells(row, cols, stat, ratios)
                  for nbytes, row in rows.items()])


def summary(args: argparse.Namespace, results: dict[str, dict[str, Any]],
            sizes: list[int]) -> list[str]:
    """One table of every operation at ``sizes`` (bytes; barrier at its one
    size): the minimum of the round averages and the ratios."""
    cols, ratios = columns_of(args), _ratio_columns(args)
    body = []
    for op in args.ops:
        for nbytes, row in results.get(op, {}).items():
            if op == "barrier" or int(nbytes) in sizes:
                body.append([op, _fmt_bytes(int(nbytes))] + _cells(row, cols, "min", ratios))
    if not body:
        return []
    return ["Summary: minimum of the round averages, us per call, at "
            + ", ".join(_fmt_bytes(n) for n in sizes)] + \
        _grid(["operation", "size"] + cols + ratios, body, left=1) + [""]


def _ratio_columns(args: argparse.Namespace) -> list[str]:
    have = set(columns_of(args))
    need = {"mcr-C (us)": {"mcr-mpi", "C"}, "mcr-Cmt (us)": {"mcr-mpi", "C-mt"},
            "mcr/mpi4py-np": {"mcr-mpi", "mpi4py-numpy"},
            "mcr/mpi4py-pt": {"mcr-mpi", "mpi4py-torch"}, "mcr/C": {"mcr-mpi", "C"},
            "mcr/C-mt": {"mcr-mpi", "C-mt"}, "gloo/torch": {"mcr-gloo", "torch-gloo"},
            "pers/nonpers": {"mcr-mpi", "mcr-mpi pers"}, "C pers/nonpers": {"C", "C pers"},
            "pers/nb": {"mcr-mpi nb", "mcr-mpi pers"}, "C pers/nb": {"C nb", "C pers"},
            "auto/best": {"mcr-auto", "mcr-mpi"}}
    return [k for k in RATIOS if need[k] <= have]


def targets(results: dict[str, dict[str, Any]], nprocs: int, buffer: str) -> list[dict[str, Any]]:
    """Issue 10, points 3 and 4: each target with its verdict on the minimum of
    the rounds.

    Parameters
    ----------
    results : dict
        ``results[op][bytes][column]`` as measured.
    nprocs : int
        The world size (the targets are set at 2).
    buffer : str
        ``"torch"`` or ``"torch-cuda"`` (the targets are set on CPU tensors).

    Returns
    -------
    list of dict
        ``name``, ``met`` (True, False, or None when nothing was measured that
        it applies to), ``worst`` (``op``, ``bytes``, ``value``, and the same
        ratio for C where there is one), ``misses`` (every (op, bytes, value)
        that misses) and ``applies`` (False when the run is not at 2 ranks on
        CPU tensors: for information only).
    """
    applies = nprocs == 2 and buffer == "torch"
    specs: list[tuple[str, str, Callable[[int], bool], float, str | None]] = [
        (f"<= 1 KiB: mcr - C-mt <= {TARGET_MINUS_CMT_US:.1f} us", "mcr-Cmt (us)",
         lambda n: n <= SMALL_BYTES, TARGET_MINUS_CMT_US, None),
        (f"1 KiB to 1 MiB: mcr / C-mt <= {TARGET_CMT}", "mcr/C-mt",
         lambda n: SMALL_BYTES <= n <= LARGE_BYTES, TARGET_CMT, None),
        (f"<= 1 KiB: mcr / mpi4py-numpy <= {TARGET_MPI4PY_NUMPY}", "mcr/mpi4py-np",
         lambda n: n <= SMALL_BYTES, TARGET_MPI4PY_NUMPY, None),
        ("<= 1 KiB: mcr / mpi4py-torch <= 1/20", "mcr/mpi4py-pt",
         lambda n: n <= SMALL_BYTES, TARGET_MPI4PY_TORCH, None),
        (f"4 B to 4 MiB: mcr-gloo / torch-gloo <= {TARGET_GLOO}", "gloo/torch",
         lambda n: n <= GLOO_MAX_BYTES, TARGET_GLOO, None),
        (f"persistent no slower than blocking: mcr pers / mcr <= {TARGET_PERSISTENT} "
         "(within 3 %)", "pers/nonpers", lambda n: True, TARGET_PERSISTENT,
         "C pers/nonpers"),
        (f"auto within {TARGET_AUTO - 1:.0%} of the fastest mcr backend: mcr-auto / "
         f"min(mcr-mpi, mcr-gloo) <= {TARGET_AUTO}", "auto/best", lambda n: True,
         TARGET_AUTO, None),
        (f"persistent no slower than non-blocking: mcr pers / mcr nb <= "
         f"{TARGET_PERSISTENT} (within 3 %)", "pers/nb", lambda n: True, TARGET_PERSISTENT,
         "C pers/nb"),
    ]
    out: list[dict[str, Any]] = []
    for name, ratio, applies_to, bound, with_c in specs:
        values: list[tuple[str, int, float, float | None]] = []
        for op, rows in results.items():
            for nbytes, row in rows.items():
                if op == "barrier" and ratio not in ("pers/nonpers", "gloo/torch", "auto/best"):
                    continue                    # no message: not a message-size target
                if not applies_to(int(nbytes)):
                    continue
                r = row_ratios(row, "min")
                x = r[ratio]
                if x is not None:
                    values.append((op, int(nbytes), x, r[with_c] if with_c else None))
        if not values and ratio == "pers/nb":
            continue                            # only when the non-blocking form ran
        if not values:
            out.append({"name": name, "ratio": ratio, "met": None, "worst": None,
                        "misses": [], "applies": applies, "bound": bound})
            continue
        worst = max(values, key=lambda v: v[2])
        misses = [{"op": o, "bytes": n, "value": x} for o, n, x, _ in values if x > bound]
        out.append({"name": name, "ratio": ratio, "met": not misses, "bound": bound,
                    "worst": {"op": worst[0], "bytes": worst[1], "value": worst[2],
                              "c_value": worst[3] if with_c else None},
                    "misses": misses, "applies": applies, "checked": len(values)})
    return out


def _target_lines(tgts: list[dict[str, Any]], nprocs: int, buffer: str) -> list[str]:
    lines = ["Targets (issue 10, points 3 and 4, and issue 11; mcr = mcr-mpi on torch "
             "tensors, minimum of the round averages):"]
    if tgts and not tgts[0]["applies"]:
        lines.append(f"  (set at 2 ranks on CPU tensors; this run: {nprocs} ranks, "
                     f"--buffer {buffer}: for information only)")
    for t in tgts:
        if t["met"] is None:
            lines += textwrap.wrap(f"{t['name']}: n/a (nothing measured that it applies to)",
                                   width=92, initial_indent="  ", subsequent_indent="      ")
            continue
        w = t["worst"]
        val = _fmt_ratio(t["ratio"], w["value"])
        extra = f"; C itself {w['c_value']:.2f}" if w.get("c_value") is not None else ""
        verdict = "met" if t["met"] else "NOT met"
        lines += textwrap.wrap(f"{t['name']}: {verdict} (worst {val} at {w['op']} "
                               f"{_fmt_bytes(w['bytes'])}{extra}; {t['checked']} (op, size) "
                               "checked)", width=92, initial_indent="  ",
                               subsequent_indent="      ")
        if t["misses"]:
            items = [f"{m['op']} {_fmt_bytes(m['bytes'])} {_fmt_ratio(t['ratio'], m['value'])}"
                     for m in t["misses"][:8]]
            if len(t["misses"]) > 8:
                items[-1] += f" and {len(t['misses']) - 8} more"
            line = "    misses:"
            for k, item in enumerate(items):
                piece = f" {item}" + ("," if k < len(items) - 1 else "")
                if len(line) + len(piece) > 92:
                    lines.append(line)
                    line = "     "
                line += piece
            lines.append(line)
    return lines


def report(args: argparse.Namespace, data: dict[str, Any]) -> list[str]:
    """The text report: setup, one table per operation and statistic, targets."""
    results, cols = data["results"], columns_of(args)
    info, env = data["info"], data["env"]
    lines = [f"mcr.bench compare: {data['nprocs']} ranks, {args.dtype}, --buffer "
             f"{args.buffer}, {plural(args.rounds, 'round')}, up to {args.iterations} calls "
             f"per loop (+{args.warmup} warm-up; above {_fmt_bytes(LARGE)}: "
             f"{args.iterations_large} +{args.warmup_large}), Python loops capped at about "
             f"{args.loop_time:g} s"]
    for k, v in env.items():
        lines.append(f"{k}: {v}")
    lines.append(f"python {info['python']}, torch {info['torch']}, numpy {info['numpy']}, "
                 f"mpi4py {info['mpi4py']} (thread level {info['mpi_thread_level']}), "
                 f"mcr {info['mcr']}")
    lines.append("MPI: " + info["build_info"]["mpi_library_version"].splitlines()[0])
    lines.append("")
    ratios = _ratio_columns(args)
    notes: dict[str, dict[str, list[str]]] = {}       # error -> column -> ops
    for op in args.ops:
        rows = results.get(op, {})
        if not rows:
            continue
        for stat in STATS if args.rounds > 1 else STATS[:1]:
            what = ("minimum" if stat == "min" else "median") + " of the round averages"
            lines.append(f"{op}: {what}, us per call")
            lines += _table(op, rows, cols, stat, ratios)
            lines.append("")
        for row in rows.values():
            for c in cols:
                cell = row.get(c)
                if cell and cell.get("error"):
                    ops = notes.setdefault(cell["error"], {}).setdefault(c, [])
                    if op not in ops:
                        ops.append(op)
    if notes:
        lines.append("Not measured (-):")
        for why, where in notes.items():
            ops_text = {"every operation" if ops == [o for o in args.ops if o in results]
                        else ", ".join(ops) for ops in where.values()}
            at = f" ({ops_text.pop()})" if len(ops_text) == 1 else ""
            lines.append(f"  {', '.join(where)}: {why}{at}")
        lines.append("")
    if args.summary:
        lines += summary(args, results, args.summary)
    lines += _target_lines(data["targets"], data["nprocs"], args.buffer)
    return lines


PLOT_COLORS = {"C": "black", "C-mt": "gray", "mpi4py-numpy": "tab:blue",
               "mpi4py-torch": "tab:orange", "torch-gloo": "tab:purple",
               "torch-nccl": "tab:brown", "mcr-gloo": "tab:olive", "mcr-nccl": "tab:cyan",
               "mcr-mpi": "tab:red", "mcr-auto": "tab:pink"}
PLOT_STYLES = {"blocking": "-", "persistent": "--", "nonblocking": ":"}


def plot(args: argparse.Namespace, results: dict[str, dict[str, Any]], path: str) -> None:
    """Latency against message size, log-log, one panel per operation.

    Raises
    ------
    SystemExit
        When matplotlib is missing (``pip install 'mcr[bench]'``).
    """
    plt = pyplot()
    ops = [op for op in args.ops if op in results and op != "barrier"]
    if not ops:
        ops = [op for op in args.ops if op in results]
    ncols = min(3, len(ops))
    nrows = (len(ops) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows),
                             squeeze=False)
    ticker = importlib.import_module("matplotlib.ticker")
    byte_labels = ticker.FuncFormatter(
        lambda x, _: _fmt_bytes(int(x)).replace(" ", "") if x >= 1 else "")
    for ax, op in zip(axes.flat, ops):
        rows = results[op]
        for peer in PEERS:
            for form in FORMS:
                c = column(peer, form)
                pts = [(max(int(n), 1), round_stat(row.get(c), "min")) for n, row in rows.items()]
                xs = [x for x, y in pts if y is not None]
                ys = [y for x, y in pts if y is not None]
                if ys:
                    ax.plot(xs, ys, marker="o", markersize=2, linewidth=1,
                            color=PLOT_COLORS[peer], linestyle=PLOT_STYLES[form], label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(base=4))
        ax.xaxis.set_major_formatter(byte_labels)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("message size (bytes)", fontsize=8)
        ax.set_ylabel("latency (us)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", linewidth=0.3)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    legend: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    labels = [c for c in columns_of(args) if c in legend]
    handles = [legend[c] for c in labels]
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.07 if nrows == 1 else 0.04, 1, 1))
    save_figure(fig, path, dpi=72)
    plt.close(fig)
