"""mcr's on/off environment variables (``MCR_CHECK``): one reading, for the core and for
:mod:`mcr._transports`, which runs before the core loads. Imports nothing of mcr's."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["flag"]


def flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """The on/off variable `name` of `environ` (default ``os.environ``): False when unset."""
    value = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if value in ("", "0", "no", "false", "off"):
        return False
    if value in ("1", "yes", "true", "on"):
        return True
    raise ValueError(f"{name}: expected 1 (on) or 0 (off), got {value!r}")
