"""The errors of checked mode and timeouts: hangs turned into exceptions.

They are plain Python classes (importing them needs neither MPI nor torch),
available as ``mcr.MismatchError`` and ``mcr.TimeoutError``. See the
"Debugging hangs" page of the documentation.
"""

import builtins
from typing import Any

__all__ = ["MismatchError", "TimeoutError"]


class MismatchError(RuntimeError):
    """The processes of a communicator called different collectives.

    Raised in checked mode (``MCR_CHECK=1`` or ``comm.checked = True``) on
    every process of the communicator, before any of them communicates, when
    they disagree on the operation, backend, root, element type, counts,
    reduction op or sequence number of a collective (a communicator's
    constructor, ``Dup``, ``Split``, ..., counts as one), or when the arguments of
    one of them were refused (a check that only the root can make, for
    instance): that process raises its own error, the others this one.

    Attributes
    ----------
    calls : list of str
        What each process called, by rank (``"Allreduce float32[4] SUM #17"``).
    """

    def __init__(self, message: str, calls: list[str] | None = None) -> None:
        super().__init__(message)
        self.calls = list(calls or [])


class TimeoutError(builtins.TimeoutError):
    """A wait lasted longer than the communicator's timeout.

    Raised by ``Wait``, ``Waitall`` and the other waits, and by a blocking
    call, when ``MCR_TIMEOUT`` (or ``comm.timeout``) is set. A subclass of
    Python's own ``TimeoutError``. The operations stay pending: the request
    can be waited on again.

    Attributes
    ----------
    pending : list of dict
        This process's pending operations, oldest first: ``op``, ``form``,
        ``backend``, ``comm``, ``seq`` (collectives), ``peer``, ``root``,
        ``tag``, ``bytes``, ``desc``, ``age`` (seconds since posted).
    request : mcr.Request or None
        For a blocking call that timed out, the request of the operation it
        started (it is still pending): ``request.Wait()`` waits for it again.
        None for the waits of the user's own requests.
    received : object
        For mpi4py's ``sendrecv`` (on pickled objects) whose receive
        completed before its send timed out, the object received (the send is
        ``request``); None otherwise.
    """

    def __init__(self, message: str, pending: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.pending = list(pending or [])
        self.request: Any = None
        self.received: Any = None
