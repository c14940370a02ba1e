"""``python -m mcr.bench.compare``: the same as ``python -m mcr.bench compare``."""

import sys

from .driver import main

if __name__ == "__main__":
    sys.exit(main())
