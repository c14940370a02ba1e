# Completion across backends. A request on Gloo or NCCL holds a _Work: the
# backend's work handles (and CUDA events), objects with is_completed() and
# wait(), plus the steps to run once they are complete (unpack a composed
# collective, copy a staged buffer back). Gloo and NCCL progress on their own
# threads and streams; MPI progresses only inside MPI calls, so every loop that
# waits here drives MPI (an Iprobe, which receives nothing) between polls.
# That is what keeps a program that waits on Gloo while its peers wait on MPI
# (or the other way round) from deadlocking.

from libc.time cimport time_t
from cpython.exc cimport PyErr_CheckSignals

cdef extern from "<unistd.h>" nogil:
    int usleep(unsigned int usec)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef object _backends = None     # mcr.backends: the registry (services.pxi), at first use


cdef object backends_module():
    global _backends
    if _backends is None:
        _backends = service("backends")
    return _backends


# The progress engine: what this process must drive besides MPI's own
# progress, from every test and wait and around every call that blocks in
# MPI. mcr.progress is the engine (staged operations: later stages this
# process's Python code posts; a Fusion's open buckets, enlisted there as a
# driver); it registers itself with _set_engine and says when it has
# something to drive (_engine_busy). The core calls it through three
# functions only: progress_poll (once per test and per turn of a wait
# loop), progress_enter/progress_exit (around a call that blocks in MPI: a
# helper thread drives meanwhile) and progress_collective (before a
# collective: what must come before it on the communicator is posted). Each
# tests one flag when the engine is idle. Code of the engine's drivers that
# a thread runs inside its own window, after the blocking call (pump_all, the
# works of freed requests), runs with the helper paused (engine.paused): one
# thread at a time drives.
cdef bint engine_busy = False   # the engine has something to drive
cdef object engine = None       # the registered engine (mcr.progress), or None


def _set_engine(obj):
    """Register the progress engine: an object with ``pump_all()``,
    ``window()`` (a context manager around a call that blocks in MPI),
    ``paused()`` (one around the engine's drivers' code run inside a window)
    and ``before_collective(comm)`` (mcr.progress registers itself)."""
    global engine
    engine = obj


def _engine_busy(bint on):
    """The engine says whether it has something to drive."""
    global engine_busy
    if on and engine is None:
        raise RuntimeError("mcr: no progress engine is registered (_set_engine)")
    engine_busy = on
    settings_changed()


cdef bint staged_quiet = False      # set while a Fusion posts or tests its own buckets


def _staged_quiet(bint on):
    """mcr.Fusion, while it posts or tests its own buckets: the calls it
    makes then neither drive the staged operations nor flush before a
    collective (the next wait does); returns the previous setting."""
    global staged_quiet
    cdef bint was = staged_quiet
    staged_quiet = on
    return was


cdef inline int progress_poll() except -1:
    """Give the works of freed requests a turn, and let the engine post what
    has become ready (a test; a turn of a wait loop)."""
    if detached:
        poll_detached()
    if engine_busy and not staged_quiet:
        engine.pump_all()
    return 0


cdef int windows_open = 0       # engine windows entered and not yet left


cdef inline object progress_enter():
    """Before a call that blocks in MPI: the engine's window is opened (its
    helper thread drives meanwhile); what to hand progress_exit after."""
    global windows_open
    if not engine_busy:
        return None
    window = engine.window()
    window.__enter__()
    windows_open += 1
    return window


cdef inline int progress_exit(object window) except -1:
    """After the blocking call that progress_enter preceded."""
    global windows_open
    if window is not None:
        windows_open -= 1
        window.__exit__(None, None, None)
    return 0


cdef inline int progress_collective(object comm) except -1:
    """Before a collective call on `comm`: what the engine holds that
    must come before it on `comm` is posted first (a Fusion's open buckets)."""
    if engine_busy and not staged_quiet:
        engine.before_collective(comm)
    return 0


cdef class _Window:
    """``with _Window():`` runs a block between progress_enter and
    progress_exit (where a try/finally is not at hand)."""
    cdef object window

    def __enter__(self):
        self.window = progress_enter()
        return self

    def __exit__(self, *exc):
        progress_exit(self.window)
        return False


@cython.final
cdef class _EngineWindow(Interceptor):
    """While the progress engine has something to drive, a blocking buffer
    call into MPI runs in its window; a collective first posts what the
    engine holds open on its communicator (a Fusion's open buckets): every
    rank posts the collectives in one order."""

    cdef bint applies_to(self, Comm comm) except -1:
        return engine_busy

    cdef object run_call(self, Comm comm, _Call c, Py_ssize_t i):
        if not OP_TABLE[c.op].flags & OP_P2P:
            progress_collective(comm)
        if c.form != BLOCKING or c.sub is not None or OP_TABLE[c.op].flags & OP_NEIGHBOR:
            return proceed(comm, c, i + 1)
        window = progress_enter()
        try:
            return proceed(comm, c, i + 1)
        finally:
            progress_exit(window)


_register(_EngineWindow(10, "progress engine"))


cdef bint progress_ready = False
cdef list detached = []        # works of freed requests, kept until they complete
cdef bint settle_at_exit = False   # whether _settle_detached is registered with atexit
cdef bint exiting = False          # Python's atexit handlers have run: modules go next


def _exiting():
    global exiting
    exiting = True


import atexit as _progress_atexit
_progress_atexit.register(_exiting)   # (first registered: runs after the others)


cdef int init_progress() except -1:
    """Whether MPI is active (initialized and not finalized): there is
    something to drive. Asked until it is, at the first waits (not at import:
    MPI may not be initialized yet)."""
    global progress_ready
    cdef int initialized = 0, finalized = 1
    MPI_Initialized(&initialized)
    MPI_Finalized(&finalized)
    progress_ready = initialized and not finalized
    return progress_ready


cdef int mpi_progress() except -1:
    """Let MPI advance its outstanding operations (non-blocking collectives
    progress only inside MPI calls). An MPI_Iprobe on COMM_WORLD: it receives
    nothing, and every MPI library tried drives all its communicators from
    it; MPICH does not from one on a duplicate of COMM_SELF, which it serves
    without its progress engine."""
    cdef int flag = 0
    if not progress_ready and not init_progress():
        return 0
    CHKERR(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag,
                      MPI_STATUS_IGNORE))
    return 0


cdef int poll_detached() except -1:
    """Test the works of freed and dropped requests; keep those still going.
    Inside a window (after its blocking call) the helper pauses meanwhile:
    a dropped request of a Fusion runs the Fusion's code (engine.paused)."""
    if windows_open and engine is not None:
        with engine.paused():
            return poll_detached_now()
    return poll_detached_now()


cdef int poll_detached_now() except -1:
    pending = detached[:]
    del detached[:]          # (a test may append: a request dropped meanwhile)
    for w in pending:
        if not settled(<_Work>w):
            detached.append(w)
    return 0


cdef bint settled(_Work w) except -1:
    """Whether the work of a freed or dropped request is over: complete, or
    failed. Its error has no caller left to raise in (an unrelated later call
    would get it): it is a RuntimeWarning instead. A dropped request's
    observers are told with it."""
    cdef bint over
    try:
        over = w.test()
    except _builtins.Exception as exc:
        lost_error(w.backend, exc)
        over = True
    if over and w.obs is not None:
        notify_all(w.obs, OBS_DONE if w.done else OBS_FAILED)
        w.obs = None
    if over and w.owner is not None:
        owner, w.owner = w.owner, None
        one_less_pending(<Comm>owner)
    return over


cdef int lost_error(str backend, object exc) except -1:
    import warnings
    warnings.warn(f"an operation on backend {backend!r} whose request was freed or "
                  f"dropped before completing failed: {exc}", RuntimeWarning)
    return 0


cdef inline int finish_call(_Call m, int mode) except -1:
    """After an operation was called: a blocking one copies its staged result
    back; and the works of freed requests get a turn."""
    if mode == BLOCKING and m.staged is not None:
        unstage(m)
    if detached:
        poll_detached()
    return 0


def _poll():
    """Drive MPI, the works of freed requests and the staged operations once
    (for the backends' own waiting loops)."""
    mpi_progress()
    progress_poll()


cdef bint oversubscribed() except -1:
    """Whether the launcher (Open MPI, MPICH's Hydra) says it started more
    ranks on this host than it has cores."""
    import os
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        try:
            return int(os.environ[name]) > (os.cpu_count() or 1)
        except (KeyError, ValueError):
            pass
    return False


# How many turns of a wait loop yield the core before the loop sleeps (idle):
# 256, so that a wait of up to about a millisecond pays no sleep's wake-up;
# 16 where the launcher put more ranks on this host than it has cores, since a
# rank that spins, even yielding, takes the core from the threads of another
# rank's backend, which do the work. A small Gloo Allreduce at 3 ranks on 2
# cores took 1.6 ms instead of 2.9, at 4 ranks 3.0 ms instead of 6.4 (torch's
# own Gloo: 2.1 and 4.4 ms); docs/performance.rst.
cdef int idle_yields = 16 if oversubscribed() else 256


def _idle_yields():
    """How many turns of a wait loop yield before it sleeps (see idle_yields)."""
    return idle_yields


cdef int idle(int spins) except -1:
    """One turn of a wait loop: drive MPI, and after a while yield the core.
    A signal's handler runs here (Ctrl-C raises KeyboardInterrupt)."""
    PyErr_CheckSignals()
    mpi_progress()
    progress_poll()
    # first yield the core (the backend's threads may need it: 2 ranks on 2
    # cores), then sleep, longer and longer, so that a long wait costs little
    cdef unsigned int usec
    if spins < idle_yields:
        with nogil:
            sched_yield()
    else:
        usec = 10 << min((spins - idle_yields) // 64, 7)     # 10 us, up to ~1.3 ms
        with nogil:
            usleep(usec)
    return 0


@cython.no_gc
cdef class _Work:
    """The non-MPI part of a request: backend work handles, then steps to run
    once they are all complete, and the status of a receive.

    Not tracked by the cycle collector (nothing it holds refers back to it:
    the status comes from `status_of`, not from a step closing over the
    work), so that what it holds counts as reachable while it lives: a
    request collected with a garbage cycle keeps its operation's buffers (see
    dropped), where the collector would otherwise clear them (a tensor's
    storage freed while a backend still writes into it)."""
    cdef readonly str backend
    cdef list works
    cdef list steps
    cdef readonly bint done
    cdef bint failed           # a wait raised: nothing is left to run
    cdef tuple status          # (source, tag, bytes, element MPI datatype) of a receive
    cdef object status_of      # a receive: returns its status once the works are complete
    cdef object keep           # buffers, until completion
    cdef _Observer obs         # a dropped request's observers, told when the work ends
    cdef object owner          # a freed or dropped request's Comm, settled when it ends

    cdef bint test(self) except -1:
        """Whether everything is complete; runs the steps the first time it is."""
        if self.done:
            return True
        try:
            for w in self.works:
                if not w.is_completed():   # (one whose operation failed may raise here)
                    return False
        except _errors.TimeoutError:    # pending still (a fused bucket's posting timed out)
            raise
        except _builtins.Exception:     # (`Exception` here is mcr.Exception)
            self.fail()
            raise
        works, self.works = self.works, []
        try:
            for w in works:
                w.wait()        # raises the backend's error; stream-orders CUDA results
        except BaseException:
            self.fail()
            raise
        steps, self.steps = self.steps, []
        for step in steps:
            step()
        if self.status_of is not None:
            status_of, self.status_of = self.status_of, None
            self.status = status_of()
        self.done = True
        self.keep = None
        return True

    cdef int wait_ready_works(self) except -1:
        """Wait, without polling, for the works that say their wait() ends
        without this process driving MPI (``wait_ready()``: a matched Gloo
        receive). Polling them would hand each to a thread: on shared cores,
        that costs more than the message."""
        for w in self.works:
            ready = getattr(w, "wait_ready", None)
            if ready is not None and ready():
                try:
                    w.wait()
                except BaseException:
                    self.fail()
                    raise
        return 0

    cdef void fail(self) noexcept:
        """A work raised its operation's error: nothing is left to wait for or
        to run (see dropped)."""
        self.works, self.steps = [], []
        self.status_of = None
        self.failed = True

    cdef int fill(self, object status) except -1:
        if status is None:
            return 0
        if not isinstance(status, _MPI.Status):
            raise TypeError(f"status: expected an MPI.Status or None, got "
                            f"{type(status).__name__}")
        cdef _MPI.Status st = <_MPI.Status>status
        if self.status is None:     # not a receive: the empty status
            set_status(&st.ob_mpi, MPI_ANY_SOURCE, MPI_ANY_TAG, 0)
            status_type(status, MPI_DATATYPE_NULL)
            return 0
        source, tag, nbytes, rtype = self.status
        set_status(&st.ob_mpi, source, tag, nbytes)
        status_type(status, <MPI_Datatype><Py_ssize_t>rtype if rtype else MPI_DATATYPE_NULL)
        return 0


cdef int wait_work(_Work w) except -1:
    cdef int spins = 0
    while True:
        w.wait_ready_works()
        if w.test():
            return 0
        idle(spins)
        spins += 1


def _waits_at_once(object req):
    """Whether a wait of `req` needs no polling: it has backend works and
    each says ``wait_ready()`` (NCCL's, stream-ordered). A Fusion's posted
    bucket asks it of its collective's request."""
    cdef _Work w = work_of(req)
    if w is None:
        return False
    for x in w.works:
        ready = getattr(x, "wait_ready", None)
        if ready is None or not ready():
            return False
    return True


cdef int detach(_Work w) except -1:
    global settle_at_exit
    if not settled(w):
        detached.append(w)
        if not settle_at_exit:
            settle_at_exit = True
            import atexit
            atexit.register(_settle_detached)
    return 0


def _settle_detached():
    """At exit, before mpi4py finalizes MPI: complete what has finished among
    the works of freed and dropped requests, so that their MPI requests are
    freed (MPICH's MPI_Finalize reports those left as references held on
    the communicator)."""
    cdef int finalized = 1
    MPI_Finalized(&finalized)
    if detached and not finalized:
        mpi_progress()
        poll_detached()


def _work_request(str backend, list works, list steps=None, object keep=None,
                  object status=None):
    """A Request completed by `works` (objects with is_completed() and wait()),
    running `steps` (callables) once they are; for the Python backends. The
    list `works` is kept, not copied: until the request completes, its
    owner may replace a handle in it (mcr.Fusion moves a call to another
    bucket so), and Waitall and the other class methods ask requests whose
    single handle is the same object once per turn.
    `status`, for a receive: a callable returning (source, tag, bytes, MPI
    datatype handle) once the works are complete."""
    cdef Request req = Request.__new__(Request)
    cdef _Work w = _Work.__new__(_Work)
    w.backend = backend
    w.works = works
    w.steps = list(steps) if steps else []
    w.keep = keep
    w.status_of = status
    req.ext = w
    return req


def _datatype_handle(str type_name):
    """The MPI datatype handle (as int) mcr uses for an element type name."""
    return <Py_ssize_t>TYPES[TYPE_NAMES.index(type_name)].mpi


def _fill_status(status, int source, int tag, Py_ssize_t nbytes, Py_ssize_t rtype=0):
    """Fill `status` (None: nothing) for a message of `nbytes` bytes."""
    if status is None:
        return
    cdef _Work w = _Work.__new__(_Work)
    w.status = (source, tag, nbytes, rtype)
    w.fill(status)
