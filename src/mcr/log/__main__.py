"""``python -m mcr.log``: read a log, or measure the logger.

    python -m mcr.log summary FILE             # the summary table of a JSON log or trace
    python -m mcr.log plot FILE [--out PNG]    # its figure
    python -m mcr.log overhead [-n 2]          # what logging costs per call
"""

import argparse
import os
import sys
from collections.abc import Sequence

from mcr._outputs import unwritable_figure


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "overhead":
        from .overhead import main as overhead
        return overhead(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m mcr.log", description=__doc__.split(
        "\n\n")[0], epilog="python -m mcr.log overhead --help: the overhead benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    p_sum = sub.add_parser("summary", help="print the summary table of a JSON log or trace")
    p_sum.add_argument("file")
    p_plot = sub.add_parser("plot", help="draw a JSON log or trace (matplotlib)")
    p_plot.add_argument("file")
    p_plot.add_argument("--out", default=None, help="the figure to write: a PNG, or the format "
                        "its extension names (default FILE.png)")
    p_plot.add_argument("--title", default="")
    sub.add_parser("overhead", help="measure what logging costs per call")
    args = parser.parse_args(argv)
    if args.command == "plot":
        args.out = args.out or os.path.splitext(args.file)[0] + ".png"
        problem = unwritable_figure(args.out)        # before the work
        if problem:
            print(f"mcr.log: cannot write {args.out}: {problem}", file=sys.stderr)
            return 2

    from .output import read_json
    try:
        records = read_json(args.file)
    except (OSError, ValueError) as exc:
        print(f"mcr.log: {exc}", file=sys.stderr)
        return 2
    if args.command == "summary":
        from .report import format_summary, rows_from_records
        print(format_summary(rows_from_records(records),
                             f"mcr communication summary ({args.file}, all ranks)"))
        return 0
    from .plot import plot
    try:
        plot(records, args.out, args.title)
    except (ValueError, ImportError) as exc:
        print(f"mcr.log: {exc}", file=sys.stderr)
        return 2
    print(f"mcr.log: wrote {args.out} ({len(records)} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
