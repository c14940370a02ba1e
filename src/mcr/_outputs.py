"""The files the command-line tools write (``--out``, ``--json``, ``--plot``):
checked before anything is measured, so an unusable path costs no run.
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Any

__all__ = ["unwritable", "unwritable_figure", "save_figure", "stamp"]


def _file_in_the_way(folder: str) -> str | None:
    """The nearest existing ancestor of ``folder`` (itself included) when it
    is not a folder, else None."""
    path = folder
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return None if os.path.isdir(path) else path


def unwritable(path: str, *, make_folder: bool = False, replace: bool = False) -> str | None:
    """Why ``path`` cannot be written (the operating system's reason), or None.

    A probe file is created beside ``path`` and removed again (permissions
    alone do not tell: root may write a read-only folder, no one writes
    ``/proc``); an existing ``path`` must be a file, and writable unless the
    writer replaces it.

    Parameters
    ----------
    path : str
        The file to write.
    make_folder : bool, optional
        Create its folder (and its parents) first, as the writer will.
    replace : bool, optional
        The writer replaces the file (``os.replace``) rather than writing
        into it: its own permissions do not matter.
    """
    folder = os.path.dirname(os.path.abspath(path))
    blocked = _file_in_the_way(folder)
    if blocked is not None:
        return f"{blocked} is not a folder"
    if os.path.isdir(path):
        return "it is a folder"
    try:
        if make_folder:
            os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".probe",
                                     dir=folder)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        return f"cannot create a file in {folder}: {exc.strerror or exc}"
    if not replace and os.path.exists(path) and not os.access(path, os.W_OK):
        return f"the file is not writable: {os.strerror(errno.EACCES)}"
    return None


def figure_format(path: str) -> str:
    """The format matplotlib writes ``path`` in: the one its extension names,
    PNG without one (matplotlib would write ``path + ".png"`` instead)."""
    return os.path.splitext(path)[1][1:].lower() or "png"


def unwritable_figure(path: str) -> str | None:
    """Why a figure cannot be written to ``path``, or None: :func:`unwritable`'s
    reasons, or an extension that names no format matplotlib writes (checked
    once matplotlib is importable; the caller says when it is not)."""
    problem = unwritable(path)
    if problem:
        return problem
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return None
    formats = FigureCanvasBase.get_supported_filetypes()
    if figure_format(path) not in formats:
        return (f"matplotlib writes no {figure_format(path)!r} files (its formats: "
                f"{', '.join(sorted(formats))}; no extension: PNG)")
    return None


def save_figure(fig: Any, path: str, dpi: int) -> None:
    """``fig.savefig`` to ``path`` itself, in :func:`figure_format`'s format."""
    fig.savefig(path, dpi=dpi, format=figure_format(path))


def stamp(path: str) -> tuple[int, int] | None:
    """What tells whether ``path`` was written since (its inode and time of
    change), or None when there is no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
