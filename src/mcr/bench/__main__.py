"""Entry point of ``python -m mcr.bench <name> [options]`` (see :mod:`mcr.bench.osu`),
and of ``python -m mcr.bench compare [options]`` (see :mod:`mcr.bench.compare`)."""

import sys


def main() -> int:
    if sys.argv[1:2] == ["compare"]:
        from .compare import main as compare
        return compare(sys.argv[2:])
    from .osu import main as osu
    return osu()


if __name__ == "__main__":
    sys.exit(main())
