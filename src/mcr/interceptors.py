"""Interceptors: the features on the call path, and how to add one.

Every buffer method of ``mcr.Comm`` (point-to-point, collectives, their
``I...`` and ``..._init`` forms) and every neighbourhood collective of a
topology is one call, an ``mcr.Call``, that runs through the chain of
interceptors that apply to its communicator, then is posted on its backend.
mcr's own features are interceptors, registered by the core in this order:

=====  =========================================  ==============================
order  name                                       applies while
=====  =========================================  ==============================
10     progress engine                            staged operations are pending
                                                  (an ``mcr.Fusion`` bucket open,
                                                  a compressed call's stages): a
                                                  collective first posts what a
                                                  Fusion holds open on its
                                                  communicator; a blocking MPI
                                                  call runs in the engine's window
20     auto                                       any other applies (it chooses
                                                  the backend for ``"auto"``)
30     hooks                                      a hook is installed
                                                  (:mod:`mcr.hooks`)
50     checked mode, timeouts, flight recorder    the communicator is checked or
                                                  has a timeout, or the recorder
                                                  is on
60     logger                                     :mod:`mcr.log` is on
70     compression                                the communicator has a
                                                  ``compress`` default, or the
                                                  call passes ``compress``
=====  =========================================  ==============================

A communicator keeps the chain of those that apply to it and builds it again
only when a setting changes; with none, a call pays one pointer test.

Interceptors also see the calls that make communicators (``Dup``, ``Split``,
``Create_cart``, ...) and mpi4py's methods on pickled objects (``bcast``,
``allreduce``, ``send``, ``isend``, ...; ``call.args`` are mpi4py's
arguments, ``call.backend`` is ``"mpi"``). They see the program's calls
only: mcr's own exchanges on the communicator (a backend's set-up the first
time it runs there, auto's agreement on its tuning table) run on mpi4py's
view of it, after the processes have met within the communicator's timeout;
a compressed call's stages run on private communicators that they do not see
(nor its Dups). A neighbourhood collective is seen once, not again as the
mpi4py calls that run it.

Adding a feature is one class and one registration::

    import mcr, mcr.interceptors

    class Count(mcr.interceptors.Interceptor):
        def __init__(self):
            super().__init__(order=35, name="count")
            self.calls = 0

        def run(self, call, next):
            self.calls += 1              # call.op, call.form, call.backend, call.args
            return next(call)            # the rest of the chain, then the backend

    counter = Count()
    mcr.interceptors.register(counter)

``next`` runs the call ``run`` was given (it takes that ``mcr.Call`` only;
calls are made by mcr, read-only). ``run`` may also answer without calling
``next``, or raise, before any process communicates. Its answer is what ``next`` would return: None for a
blocking buffer method, an ``mcr.Request`` for a non-blocking one, an
``mcr.Prequest`` for a ``..._init``, the new communicator for a constructor
(as mpi4py's method makes it), a request for ``isend``; an answer of
another kind raises ``TypeError`` naming the interceptor, before the method
uses it. An
interceptor whose ``applies(comm)`` reads a setting of its own calls
:func:`changed` when that setting changes.
"""

from mpi4py import MPI  # noqa: F401  (first: it loads the libmpi the core links to)

from ._core import Call, Interceptor, _changed, _interceptors, _register, _unregister
from ._core import _chain as _comm_chain

__all__ = ["Call", "Interceptor", "register", "unregister", "registered", "chain", "changed"]


def register(interceptor: Interceptor) -> None:
    """Register `interceptor`: it runs in the calls of every communicator it
    applies to, after those of a lower ``order`` and those of its order
    registered before it.

    Raises
    ------
    TypeError
        If `interceptor` is not an ``mcr.interceptors.Interceptor``.
    ValueError
        If it is registered already.
    """
    _register(interceptor)


def unregister(interceptor: Interceptor) -> None:
    """Unregister `interceptor`.

    Raises
    ------
    ValueError
        If it is not registered.
    """
    _unregister(interceptor)


def registered() -> list[Interceptor]:
    """The registered interceptors (mcr's own included), in the order they run."""
    return _interceptors()


def chain(comm: object) -> list[Interceptor]:
    """The interceptors `comm`'s calls run through now."""
    return _comm_chain(comm)


def changed() -> None:
    """Tell every communicator to ask the interceptors' ``applies`` again at
    its next call (a setting an ``applies`` reads has changed)."""
    _changed()
