"""What drives the staged operations of the process (``mcr.stages``) and the
drivers others enlist (``mcr.Fusion``, while it has open buckets): every wait
and test of mcr posts what has become ready (``pump_all``), a collective call
first lets them post what must come before it (``before_collective``), and a
blocking call into MPI runs in a ``window`` in which a helper thread drives
them (see ``mcr.stages`` for why).

A layer below the staged operations and the backends: a backend's blocking
set-up (``Subcomm.start``) opens a window, and the staged operations make
their backend groups, without either importing the other.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any

from mpi4py import MPI

from mcr import _core

__all__ = ["LOCK", "enlist", "dismiss", "in_helper", "is_blocked", "pump_all",
           "before_collective", "window", "paused"]

LOCK = threading.RLock()
# what has work to post (an ordered set): groups with stages still to post,
# and drivers others enlist (``mcr.Fusion``, while it has open buckets)
_active: dict[Any, None] = {}


def enlist(driver: Any) -> None:
    """Drive ``driver`` from every wait of the process, as the staged
    operations: it has ``pump(helper)`` (post what it can, now, without
    blocking), ``blocking()`` (the calling thread is about to block in MPI)
    and ``collective(comm)`` (the calling thread is about to make a
    collective call on ``comm``)."""
    with LOCK:
        if driver not in _active:
            _active[driver] = None
            _core._engine_busy(True)


def dismiss(driver: Any) -> None:
    """Stop driving ``driver``."""
    with LOCK:
        if _active.pop(driver, 0) is None and not _active:
            _core._engine_busy(False)


def in_helper() -> bool:
    """Whether the calling thread is the helper."""
    return _helper is not None and threading.get_ident() == _helper.ident


def is_blocked(ident: int) -> bool:
    """Whether thread `ident` is blocked in MPI (inside a window) while the
    helper drives: the helper may drive what that thread uses (its code
    that drives runs paused)."""
    return _helper is not None and not _helper.parked.is_set() and ident in _open


def pump_all() -> None:
    """Post every stage that has become ready, of every staged operation of
    this process (the helper thread leaves those on CUDA tensors to the
    threads that called them)."""
    helper = in_helper()
    with paused():
        for driver in list(_active):
            driver.pump(helper)


class paused:
    """``with paused():`` around the drivers' code that a thread may run
    inside its own window, between the blocking call and the window's end
    (the works of freed requests, a wait under a timeout, a backend's
    set-up): the helper stops meanwhile, so that one thread at a time
    drives (a ``Fusion`` is not thread-safe; both threads reading its
    decisions lost one: a hang). Any thread in a window pauses it, and no
    thread opens it again until every pause has ended. Does nothing in any
    other thread, the helper included."""

    __slots__ = ("helper",)

    def __enter__(self) -> paused:
        global _pauses
        self.helper = None
        if _helper is not None and threading.get_ident() in _open:
            with _WLOCK:                # (no thread opens it again until the pause ends)
                _pauses += 1
            self.helper = _helper
            self.helper.close()
        return self

    def __exit__(self, *exc: object) -> None:
        global _pauses
        if self.helper is not None:
            with _WLOCK:
                _pauses -= 1
            _reopen(threading.get_ident())


def before_collective(comm: Any) -> None:
    """The calling thread is about to make a collective call on ``comm``
    (buffer methods, neighborhood collectives, constructors, mpi4py's
    methods on pickled objects): what must come before it on ``comm`` is
    posted first (a ``Fusion``'s open buckets)."""
    with paused():                  # (in a window: Subcomm.start's rendezvous)
        for driver in list(_active):
            driver.collective(comm)


class _Helper:
    """The thread that drives staged operations while the calling thread is
    blocked inside MPI (between ``open`` and ``close``)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.stop = threading.Event()
        self.parked = threading.Event()
        self.parked.set()
        self.opener: int | None = None     # the thread blocked in MPI meanwhile
        self.thread = threading.Thread(target=self.run, name="mcr-stages", daemon=True)
        self.thread.start()
        self.ident = self.thread.ident

    def run(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            pause = 2e-5
            while not self.stop.is_set() and _active:
                try:
                    pump_all()
                except Exception as exc:   # (a flight's own error is kept by it)
                    warnings.warn(f"mcr.stages: driving staged operations failed: {exc}",
                                  RuntimeWarning)
                self.stop.wait(pause)
                pause = min(2 * pause, 1e-3)
            self.parked.set()

    def open(self, opener: int) -> None:
        self.opener = opener
        self.parked.clear()
        self.stop.clear()
        self.go.set()

    def close(self) -> None:
        self.stop.set()
        self.parked.wait()



_helper: _Helper | None = None
_usable: bool | None = None        # whether MPI provides THREAD_MULTIPLE
# the threads inside a window (blocked in MPI; an ordered set, nested windows
# counting once): the helper drives while any is, for one of them at a time
# (its opener); when the opener leaves, it is handed to another one still there
_open: dict[int, None] = {}
_pauses = 0                        # paused() blocks under way: the helper stays stopped
_WLOCK = threading.Lock()          # guards _open, _pauses and the helper's opening


def _reopen(me: int) -> None:
    """The helper has been closed by thread `me` (its window ended, or a
    pause did): open it again for a thread still blocked in a window, if
    there is one and no other thread has opened it meanwhile."""
    with _WLOCK:
        if _open and not _pauses and _helper is not None and _helper.parked.is_set():
            _helper.open(me if me in _open else next(iter(_open)))


class window:
    """``with window():`` around a blocking call into MPI made while staged
    operations have stages to post: the helper thread drives them until the
    call returns (until every thread blocked in such a call has returned).
    Does nothing in the helper itself, or without ``MPI_THREAD_MULTIPLE``."""

    __slots__ = ("helper",)

    def __enter__(self) -> window:
        global _helper, _usable
        self.helper = None
        me = threading.get_ident()
        if me in _open or not _active or (_helper is not None and me == _helper.ident):
            return self
        for driver in list(_active):
            driver.blocking()
        if _usable is None:
            _usable = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
        if not _usable or not _active:
            return self
        with _WLOCK:
            if _helper is None:
                _helper = _Helper()
            _open[me] = None
            if _helper.parked.is_set() and not _pauses:
                _helper.open(me)
        self.helper = _helper
        return self

    def __exit__(self, *exc: object) -> None:
        if self.helper is not None:
            me = threading.get_ident()
            with _WLOCK:
                del _open[me]
                mine = self.helper.opener == me
            if mine:
                self.helper.close()
                _reopen(me)


# this module is the core's progress engine: its waits, tests and blocking
# calls drive what is enlisted here (pump_all, window, before_collective)
_core._set_engine(sys.modules[__name__])
