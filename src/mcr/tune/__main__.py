"""``python -m mcr.tune``: see :mod:`mcr.tune`."""

import sys

from .driver import main

if __name__ == "__main__":
    sys.exit(main())
