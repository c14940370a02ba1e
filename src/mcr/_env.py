"""mcr's environment variables of a kind (on/off as ``MCR_CHECK``, seconds as
``MCR_TIMEOUT``, counts as ``MCR_FLIGHT_KEEP``): one reading each, for the core, the backends
and :mod:`mcr._transports`, which runs before the core loads. A bad value raises ValueError
naming the variable. Imports nothing of mcr's."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["count", "flag", "seconds"]


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """The on/off variable `name` of `environ` (default ``os.environ``): False when unset."""
    value = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if value in ("", "0", "no", "false", "off"):
        return False
    if value in ("1", "yes", "true", "on"):
        return True
    raise ValueError(f"{name}: expected 1 (on) or 0 (off), got {value!r}")


def seconds(name: str, environ: Mapping[str, str] | None = None) -> float:
    """The seconds of variable `name` (a number >= 0); 0 (none) when unset or 0, as
    ``comm.timeout = 0``."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if not value:
        return 0.0
    try:
        out = float(value)
    except ValueError:
        out = -1.0
    if not 0 <= out < float("inf"):
        raise ValueError(f"{name}: expected a number of seconds >= 0 (0: none), got {value!r}")
    return out


def count(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """The count of variable `name` (an integer >= 1); `default` when unset."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if not value:
        return default
    try:
        out = int(value)
    except ValueError:
        out = 0
    if not 1 <= out <= sys.maxsize:
        raise ValueError(f"{name}: expected a whole number from 1 to {sys.maxsize}, "
                         f"got {value!r}")
    return out
