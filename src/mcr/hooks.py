"""Call hooks: functions that see every buffer method call, on every backend.

Every buffer method of ``mcr.Comm`` (point-to-point, collectives, their
``I...`` and ``..._init`` forms) goes through one dispatch step, and that step
runs the installed hooks before the operation communicates. So do the
neighborhood collectives of topologies (``Neighbor_alltoall``, ...), whose
``args`` are ``(sendbuf, recvbuf)``. Logging, debug
checks and timeouts are built the same way, as interceptors
(:mod:`mcr.interceptors`; the hooks are one). With nothing installed the call
path pays one pointer test.

A hook is called with an ``mcr.hooks.Call`` (``comm``, ``op``, ``form``,
``backend``, ``args``). It may return a callable, which is called with the
call's result (``None`` for a blocking call, the ``Request`` or ``Prequest``
otherwise) once the operation has run or been posted. An exception raised by
a hook propagates to the caller before the operation starts, as does a
``TypeError`` when it returns something else than a callable or None. A
collective a hook refused on some processes only is one they skipped: the
others wait for it (under checked mode, the next collective is a
``MismatchError`` on every process, their calls being out of step). One
raised by the callable propagates after: a non-blocking or persistent
operation's request is then the exception's ``request`` attribute, to wait
for or free::

    import mcr, mcr.hooks

    def trace(call):
        print(call.op, call.form, call.backend)

    with mcr.hooks.installed(trace):
        mcr.COMM_WORLD.Allreduce(x, y)

Hooks see the ``..._init`` call of a persistent request, not its ``Start``;
a persistent request that mcr emulates (on Gloo and NCCL, or where MPI lacks
persistent collectives) posts the non-blocking form at each ``Start``, which
the hooks see as such.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from mpi4py import MPI  # noqa: F401  (first: it loads the libmpi the core links to)

from ._core import Call, _add_call_hook, _remove_call_hook

__all__ = ["Call", "add", "remove", "installed"]

Hook = Callable[[Call], Callable[[Any], None] | None]


def add(hook: Hook) -> None:
    """Install `hook`, after those already installed (they run in that order).

    Raises
    ------
    TypeError
        If `hook` is not callable.
    """
    _add_call_hook(hook)


def remove(hook: Hook) -> None:
    """Uninstall `hook`.

    Raises
    ------
    ValueError
        If `hook` is not installed.
    """
    _remove_call_hook(hook)


@contextlib.contextmanager
def installed(hook: Hook) -> Iterator[Hook]:
    """Install `hook` for the duration of a ``with`` block."""
    add(hook)
    try:
        yield hook
    finally:
        remove(hook)
