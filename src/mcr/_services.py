"""The modules the compiled core calls, provided to it by the top layer.

The core (``mcr._core``) lies below the Python modules that do part of its
work: the backends' registry, staged operations, tuning tables,
compression, the CUDA device interface, the launchers' job names. Those
import the core, so the core imports none of them. ``mcr/__init__.py``
provides each here instead, by name, as a function that imports it at
first use (several import torch, which ``import mcr`` must not), and the
core asks for it by name (``get``). This module imports nothing of mcr's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["provide", "get", "names"]

_LOADERS: dict[str, Callable[[], Any]] = {}
_LOADED: dict[str, Any] = {}


def provide(name: str, loader: Callable[[], Any]) -> None:
    """Provide the service ``name``: ``loader()`` returns it, called at the
    core's first need."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a string, got {type(name).__name__}")
    if not callable(loader):
        raise TypeError(f"loader: expected a callable, got {type(loader).__name__}")
    _LOADERS[name] = loader
    _LOADED.pop(name, None)


def get(name: str) -> Any:
    """The service ``name``, loaded at the first call."""
    found = _LOADED.get(name)
    if found is None:
        loader = _LOADERS.get(name)
        if loader is None:
            raise RuntimeError(f"mcr: no module provides {name!r} to the core (provided: "
                               f"{', '.join(sorted(_LOADERS)) or 'none'}); mcr's own "
                               "are provided by importing the mcr package")
        found = _LOADED[name] = loader()
    return found


def names() -> tuple[str, ...]:
    """The names provided so far."""
    return tuple(sorted(_LOADERS))
