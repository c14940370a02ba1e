"""Staged operations: collectives made of several exchanges with local work
between them, posted in the same order on every process and driven from
every wait of the process.

Who uses it: ``mcr.compress`` (a compressed Allreduce is an all-to-all,
local decoding and reduction, then an all-gather) and the composed
non-blocking neighborhood collectives (``Ineighbor_*`` on Gloo, and on MPI
where Open MPI's order is wrong: a size exchange, an agreement on whether a
block is too long, then the exchange of the blocks). ``mcr.Fusion`` enlists
itself while it has open buckets (``enlist``): it is driven by the same
waits, and asked to flush before a collective on its communicator
(``before_collective``).

An operation is a *pipeline*: a generator that does local work and yields,
for each stage, a function ``post(private)`` that posts the stage's exchange
on the private communicator ``private`` (non-blocking) and returns something
with ``Test()``. It is resumed once that exchange has completed.

Private communicators, and the order of stages
----------------------------------------------
Stage ``k`` of every staged operation of a communicator on one backend runs
on a private duplicate of it, ``private_comms(comm, backend).comms[k]``, made
(with its Gloo or NCCL group) by the first operation that needs it, inside
that call (``Dup`` is collective: the call waits there for the other
processes, as the first call on a backend does). Stage 0 is posted by the
call itself (or by the helper thread, below, if it is at work on the group
then). A later stage is posted once the stage before it has completed,
which each process finds out at its own time.
Collectives on one communicator must be posted in the same order on every
process, so each private communicator keeps a FIFO of the operations whose
stage on it is still to be posted, in the order the operations were posted
(the same on every process): an operation's stage ``k`` is posted only once
every operation before it has posted its own.

Progress
--------
MPI's progress rule: an operation every process has started completes while
the processes are inside MPI calls, whatever those calls are. A later stage
needs this process's Python code to post it, so mcr drives every staged
operation of the process (``pump_all``):

- in every wait loop of mcr and in every ``Test`` (``Request.Test``,
  ``Testall``, ... of any request);
- during a blocking MPI call of mcr (``Recv``, ``Barrier``, ``Allreduce``,
  ``Request.Wait``, ``Waitall``, mpi4py's methods on pickled objects, ``Dup``,
  ``Split``, ...): while such a call is inside MPI, a helper thread posts the
  stages that become ready (``window``). It runs only then, and only when the
  MPI library provides ``MPI_THREAD_MULTIPLE`` (the default of mpi4py and
  mcr); otherwise those calls do not drive the stages.

The start of a blocking call (``window``) first tells every driver
(``blocking()``, in the calling thread: rank 0 of a Fusion posts its open
buckets there), then starts the helper if something is still to drive.

That driving (``enlist``, ``pump_all``, ``window``, the helper) lives a
layer down, in ``mcr.progress``, where the backends' blocking set-up reaches
it too; this module names it again for the core, which calls it here.

Not driven: a process computing outside mcr, or blocked in a call of another
library (mpi4py's own request objects, ``Win``, ``File``). The later stages
of an operation on CUDA tensors are posted by the thread that called it (its
current CUDA stream orders the local work), not by the helper.

Threads: one thread at a time works on the operations of a group (its
``owner``; ``LOCK`` guards that and the set of groups with stages to post).
A thread that finds a group taken passes it by: the helper does, and so does
the calling thread (its test says "not yet").

An operation whose stage fails to post (its local work raised) fails alone:
its request raises the error in ``Wait``/``Test``, and the operations after it
go on. The other processes do not learn of it and may wait for its next
stage, as they would for any process that stopped calling.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

from mpi4py import MPI

from mcr import _core
from mcr.progress import (LOCK, before_collective, dismiss, enlist, in_helper, is_blocked,
                          pump_all, window)

__all__ = ["Pipeline", "Group", "Flight", "private_comms", "launch", "pump_all", "window",
           "enlist", "dismiss", "is_blocked", "before_collective", "LOCK"]

# A pipeline yields, for each stage, the function that posts its exchange on
# that stage's private communicator; it is resumed once the exchange is done.
Post = Callable[[Any], Any]
Pipeline = Generator[Post, None, None]

class Group:
    """The private communicators of one (communicator, backend): stage ``k``
    runs on ``comms[k]``; ``waiting[k]``: the operations whose stage ``k`` is
    still to be posted, in posting order."""

    def __init__(self, comm: Any, backend: str) -> None:
        self.comm, self.backend = comm, backend
        self.comms: list[Any] = []
        self.waiting: list[deque[Flight]] = []
        self.owner: int | None = None     # the thread working on its operations

    def ensure(self, stages: int) -> None:
        """Make the first ``stages`` private communicators, and their
        backend's groups (collective: inside a call every process makes;
        blocking, so the helper drives the other operations meanwhile).
        ``Idup`` would not wait, but Open MPI 5.0 completes a process's
        ``MPI_Comm_idup`` only once the others have posted the ones it posted
        after it."""
        while len(self.comms) < stages:
            # (a window: Comm.made); unlogged: the logger records the user's call, and
            # the program's interceptors see that call, not mcr's Dup and stages
            private = _core._private_dup(self.comm)
            private.compress = None             # its payloads are encoded already
            if self.backend != "mpi":
                # the backend's group too, now: a lazy one would be set up
                # inside some stage's post, which processes reach at different
                # points (start: a window of its own)
                from mcr import backends
                backends.subcomm(private, self.backend).start()
            self.comms.append(private)
            self.waiting.append(deque())        # (last: pump reads the others by its index)

    def queue(self, flight: Flight) -> None:
        """Queue every stage of ``flight``, just made."""
        for k in range(flight.stages):
            self.waiting[k].append(flight)
        enlist(self)

    def blocking(self) -> None:
        """(Its stages are posted by the helper, or by the next wait.)"""

    def collective(self, comm: Any) -> None:
        """(Its stages run on private communicators: no order to keep.)"""

    def take(self) -> bool:
        """Become the one thread working on this group's operations; False
        when a thread is (this one, further up its stack, or the other)."""
        with LOCK:
            if self.owner is not None:
                return False
            self.owner = threading.get_ident()
            return True

    def drop(self) -> None:
        with LOCK:
            self.owner = None
            if not any(self.waiting):
                dismiss(self)

    def pump(self, helper: bool = False) -> None:
        """Post every stage that has become ready, in posting order (`helper`:
        not those of operations on CUDA tensors)."""
        if not self.take():
            return
        try:
            moved = True
            while moved:
                moved = False
                for k, queue in enumerate(self.waiting):
                    while queue and queue[0].due(k, helper):
                        flight = queue.popleft()
                        if not flight.failed():
                            flight.post(k)
                        moved = True
        finally:
            self.drop()

    def free(self) -> None:
        dismiss(self)
        for private in self.comms:
            private.Free()
        self.comms.clear()


class Flight:
    """One staged operation in progress (the work of its Request)."""

    def __init__(self, group: Group, pipeline: Pipeline, stages: int, cuda: bool = False,
                 done: Callable[[], object] | None = None) -> None:
        self.group, self.pipeline, self.stages, self.cuda = group, pipeline, stages, cuda
        self.done = done
        self.stage = -1
        self.req: Any = None
        self.req_done = False
        self.finished = False
        self.error: BaseException | None = None

    def post(self, k: int) -> None:
        """Post stage ``k`` (its previous stage is complete). Its local work
        raising fails this operation (see ``failed``)."""
        try:
            poster = next(self.pipeline)
            self.stage, self.req_done = k, False
            self.req = poster(self.group.comms[k])
        except Exception as exc:       # (Python's own: KeyboardInterrupt propagates)
            self.error = exc

    def failed(self) -> bool:
        return self.error is not None

    def due(self, k: int, helper: bool) -> bool:
        """Whether stage ``k`` is to be posted now (or dropped: failed), as
        the head of its queue (`helper`: by the helper thread)."""
        if self.error is not None:
            return True
        if self.stage != k - 1 or (helper and self.cuda):
            return False
        return k == 0 or self.ready()

    def ready(self) -> bool:
        """Whether the stage in flight is complete."""
        if not self.req_done:
            self.req_done = bool(self.req.Test())
        return self.req_done

    def is_completed(self) -> bool:
        if self.finished:
            return True
        group = self.group
        group.pump(in_helper())
        if not group.take():        # (another thread is posting its stages: not yet)
            return False
        try:
            if self.error is not None:
                return True
            if self.stage == self.stages - 1 and self.ready():
                try:
                    for _ in self.pipeline:     # the last local work; the pipeline ends here
                        raise RuntimeError("stages: a pipeline has more stages than it said")
                except Exception as exc:
                    self.error = exc
                    return True
                self.finished = True
                if self.done is not None:
                    self.done()
        finally:
            group.drop()
        return self.finished

    def wait(self) -> None:
        """Called once complete: raise the error of a failed operation."""
        if self.error is not None:
            raise self.error


def private_comms(comm: Any, backend: str) -> Group:
    """The private communicators of ``comm``'s staged operations on
    ``backend`` (one per stage, made as operations need them)."""
    state = _attached(comm)
    group = state.get(backend)
    if group is None:
        group = state[backend] = Group(comm, backend)
    assert isinstance(group, Group)
    return group


_KEYVAL: int | None = None


def _attached(comm: Any) -> dict[Any, Any]:
    """The dict of staged-operation state kept on ``comm`` (an MPI attribute)."""
    global _KEYVAL
    if _KEYVAL is None:
        _KEYVAL = MPI.Comm.Create_keyval(delete_fn=_release)
    found = comm.Get_attr(_KEYVAL)
    if found is None:
        found = {}
        comm.Set_attr(_KEYVAL, found)
    state: dict[Any, Any] = found
    return state


def _release(comm: Any, keyval: int, state: dict[Any, Any]) -> None:
    """MPI's delete callback: ``comm`` is being freed (collectively), so are
    its private communicators. At MPI_Finalize (COMM_WORLD, COMM_SELF) MPI
    frees them itself."""
    if comm == MPI.COMM_WORLD or comm == MPI.COMM_SELF:
        return
    for held in state.values():
        held.free()


def launch(comm: Any, backend: str, stages: int, pipeline: Pipeline, cuda: bool = False,
           done: Callable[[], object] | None = None) -> Flight:
    """Start a new operation of ``stages`` stages on ``comm``'s private
    communicators for ``backend``: its stage 0 is posted now when they are
    made (else by the first wait or test after), the later ones queued; its
    work handle (for ``_core._work_request``). ``done`` is called once it
    completes. What its first local work raises here (before any exchange)
    is raised by the call."""
    group = private_comms(comm, backend)
    group.ensure(stages)
    flight = Flight(group, pipeline, stages, cuda, done)
    group.queue(flight)
    group.pump()
    if flight.error is not None and flight.stage <= 0:
        raise flight.error
    return flight
