"""The files the command-line tools write (``--out``, ``--json``, ``--plot``):
checked before anything is measured, so an unusable path costs no run.
"""

from __future__ import annotations

import errno
import os
import tempfile

__all__ = ["unwritable", "stamp"]


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


def stamp(path: str) -> tuple[int, int] | None:
    """What tells whether ``path`` was written since (its inode and time of
    change), or None when there is no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
