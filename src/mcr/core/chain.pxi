# Features as interceptors. Each feature on the call path of the buffer
# methods and the neighbourhood collectives (the progress engine: a Fusion's
# flush and the staged window; auto, the call hooks, checked mode with
# timeouts and the flight recorder, the logger, compression) is an
# Interceptor, defined and registered in its own file. A communicator keeps the chain of those that
# apply to it, rebuilt when a setting changes (settings_changed: the global
# epoch moves on); an empty chain is the fast path of Comm.call. A call runs
# through the chain in order: each interceptor's run gets the call and goes
# on with the next (proceed), or answers itself; past the last, the call is
# posted on its backend (Comm.post_call).

cdef list interceptors = []          # registered, by order
cdef object NOT_CALLED = object()    # an interceptor's `next`, before it is called
cdef unsigned long chain_epoch = 1   # moves on at every change of a setting


cdef int settings_changed() except -1:
    """A setting that decides which interceptors apply changed: every
    communicator rebuilds its chain at its next call."""
    global chain_epoch
    chain_epoch += 1
    return 0


cdef class Interceptor:
    """A feature on the call path of a communicator's buffer methods and
    neighbourhood collectives.

    Subclass it and define ``run(call, next)``: look at the call (an
    ``mcr.Call``, read-only), then return ``next(call)`` (what the rest of
    the chain and the backend return: None, a ``Request`` or a
    ``Prequest``; for a constructor, the new communicator), or answer
    without it. ``applies(comm)`` says whether it takes part in `comm`'s
    calls (default: always); communicators ask it again after
    ``mcr.interceptors.changed()``. Register it with
    ``mcr.interceptors.register``; interceptors run by increasing ``order``
    (the built-in ones: 10 progress engine, 20 auto, 30 call hooks, 50
    checked mode, timeouts and flight recorder, 60 logger, 70
    compression).
    """
    cdef readonly int order
    cdef readonly str name
    cdef bint companion      # only in a chain some other interceptor is in (auto)

    def __init__(self, order=35, name=None):
        if isinstance(order, bool) or not isinstance(order, int):
            raise TypeError(f"order: expected an integer, got {type(order).__name__}")
        self.order = order
        self.name = type(self).__name__ if name is None else str(name)

    def applies(self, comm):
        """Whether this interceptor takes part in `comm`'s calls."""
        return True

    def run(self, call, next):
        """Run `call`: return ``next(call)``, or what the call returns."""
        return next(call)

    cdef bint applies_to(self, Comm comm) except -1:
        return not comm.unlogged and bool(self.applies(comm))     # (the program's calls)

    cdef str reshapes(self, Comm comm, _Call c):
        """What this interceptor will make of the parsed call's message that
        every process must make alike (compression: its codec), for checked
        mode to compare; None: nothing."""
        return None

    cdef object run_call(self, Comm comm, _Call c, Py_ssize_t i):
        """Run `c` as the i-th of the chain (the core's features override
        this: no `next` object is made for them)."""
        if c.inner:                 # (seen already, as the call that made it)
            return proceed(comm, c, i + 1)
        cdef _Next n = _Next.__new__(_Next)
        n.comm, n.index, n.result = comm, i + 1, NOT_CALLED
        n.view = call_view(comm, c)
        result = self.run(n.view, n)
        # (what the rest of the chain answered passes as it is: the check is of its own)
        expected = None if result is n.result else answer_expected(c, result)
        if expected is not None:
            raise TypeError(f"interceptor {self.name!r}: its answer to "
                            f"{c.callname or SEEN_NAMES[c.op]} ({FORM_NAMES[c.form]}) is "
                            f"{type(result).__name__}; expected {expected}")
        return result

    cdef int on_start(self, object preq, Request inner, long long t0) except -1:
        """A persistent request (an mcr.Prequest) of the communicator was
        started; `inner`: the request its start function posted (emulated),
        at `t0`, else None."""
        return 0

    def __repr__(self):
        return f"<mcr.Interceptor {self.name} order={self.order}>"


cdef str answer_expected(_Call c, object result):
    """What the method of call `c` takes from the chain, where `result`, an
    interceptor's answer, is not that (the method would fail on it, or
    crash); None where it is."""
    cdef int kind = c.kind
    if not OP_TABLE[c.op].flags & OP_COMM:          # a buffer method's, a neighbourhood one's
        if c.form == BLOCKING:
            return None if result is None else "None (a blocking call returns nothing)"
        if c.form == NONBLOCKING:
            return None if isinstance(result, Request) else "an mcr.Request"
        return None if isinstance(result, Prequest) else "an mcr.Prequest"
    if kind == COMM_MADE or kind == COMM_GROUP:     # a constructor's (the pickled: any object)
        if not c.callname[0].isupper() or c.callname == "Free":
            return None
        if c.callname in ("Dup", "Clone", "Dup_with_info"):
            return None if isinstance(result, Comm) else \
                "the copy, of the communicator's class (as mpi4py's method makes it)"
        return None if isinstance(result, _MPI.Comm) else \
            "the new communicator (an mpi4py.MPI.Comm)"
    if kind == COMM_STARTED:
        return None if isinstance(result, tuple) and len(result) == 2 and isinstance(
            result[0], Comm) and isinstance(result[1], _MPI.Request) else \
            "(the copy, a request), as mpi4py's method makes them"
    if kind == COMM_PERSISTENT:
        return None if isinstance(result, Prequest) else "an mcr.Prequest"
    if kind == COMM_POSTED or kind == COMM_P2P_POSTED:
        return None if isinstance(result, _MPI.Request) else "a request"
    return None


@cython.final
cdef class _Next:
    """The rest of the chain after an interceptor, as the callable its run gets."""
    cdef Comm comm
    cdef Py_ssize_t index
    cdef Call view           # the call the interceptor was given: the only one it runs
    cdef object result       # what it returned last (NOT_CALLED before)

    def __call__(self, call):
        if call is not self.view or call is None:     # (None: a _Next made by hand)
            raise TypeError(f"call: expected the mcr.Call the interceptor was given, got "
                            f"{'another one' if isinstance(call, Call) else type(call).__name__}")
        self.result = proceed(self.comm, self.view.call, self.index)
        return self.result


cdef object proceed(Comm comm, _Call c, Py_ssize_t i):
    """Run call `c` from the i-th interceptor of its chain on; past the last,
    post it."""
    cdef tuple chain = c.chain
    if i < len(chain):
        return (<Interceptor>chain[i]).run_call(comm, c, i)
    return comm.post_call(c)


cdef tuple build_chain(Comm comm, Interceptor forced):
    """The interceptors that apply to `comm` (and `forced`), by order; None
    when none does."""
    cdef Interceptor x
    chain = [x for x in interceptors if x is forced or
             (not x.companion and x.applies_to(comm))]
    if not chain:
        return None
    return tuple([x for x in interceptors if x in chain or (x.companion and x.applies_to(comm))])


def _register(interceptor):
    """Register `interceptor` (see mcr.interceptors.register)."""
    if not isinstance(interceptor, Interceptor):
        raise TypeError(f"interceptor: expected an mcr.Interceptor, got "
                        f"{type(interceptor).__name__}")
    if interceptor in interceptors:
        raise ValueError(f"interceptor: {interceptor!r} is registered already")
    cdef Interceptor x = interceptor
    cdef Py_ssize_t at = 0
    while at < len(interceptors) and (<Interceptor>interceptors[at]).order <= x.order:
        at += 1
    interceptors.insert(at, interceptor)
    settings_changed()


def _unregister(interceptor):
    """Unregister `interceptor` (see mcr.interceptors.unregister)."""
    try:
        interceptors.remove(interceptor)
    except ValueError:
        raise ValueError(f"interceptor: {interceptor!r} is not registered") from None
    settings_changed()


def _interceptors():
    """The registered interceptors, in the order they run."""
    return list(interceptors)


def _changed():
    """Something an interceptor's applies() reads changed (see
    mcr.interceptors.changed)."""
    settings_changed()


def _chain(comm):
    """The interceptors `comm`'s calls run through now (those that apply)."""
    return list((<Comm?>comm).current_chain() or ())
