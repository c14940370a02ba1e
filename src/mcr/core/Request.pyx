# Request: completion of non-blocking operations. It keeps the message (and so
# the buffers) alive until the operation completes.

from functools import partial

# Never cleared by the cycle collector: a request collected with a garbage
# cycle (held by an object in one, or by an exception kept in a frame) must
# reach __dealloc__ with its message and work, to keep them until the
# operation completes (see dropped); mpi4py's clear would drop the message
# first, and MPI or the backend would write into freed memory.
@cython.no_gc_clear
cdef class Request(_MPI.Request):
    """Handle of a non-blocking operation.

    An ``mpi4py.MPI.Request``: the buffers of the operation stay alive and must
    not be touched until ``Wait``/``Test`` (or a class method such as
    ``Waitall``) reports completion.
    """
    cdef MPI_Datatype rtype      # element type of a receive, for Status.Get_count
    cdef _Work ext               # the non-MPI part (backend works, steps), or None
    cdef _Observer obs           # told when the operation ends (completion.pxi), or None
    cdef bint shared             # another object holds the same handle: a copy, Request(other)
    cdef bint made               # __cinit__ ran (not when mpi4py's refused the arguments)
    cdef object owner            # the Comm it was posted on, until it completes (Comm.Free)
    cdef Request twin            # a copy: the request it was made from (see copied)

    def __cinit__(self, request=None):
        # (mpi4py's signature; no **kwargs: a dict per request costs 20 ns)
        self.rtype = MPI_DATATYPE_NULL
        self.made = True
        if request is not None and (self.ob_mpi != MPI_REQUEST_NULL
                                    or isinstance(request, Request)):
            copied(self, request)           # (mpi4py's __cinit__ copied the handle)

    def __dealloc__(self):
        # collected with its operation maybe still in flight: MPI would go
        # on reading or writing buffers that are let go here (see dropped).
        # Not made: mpi4py's __cinit__ raised, and this one's fields are NULL
        if self.made and (self.ob_mpi != MPI_REQUEST_NULL or self.ext is not None):
            dropped(self)

    cdef int failed(self, int ierr, MPI_Status *sp) except -1:
        """Raise MPI's error `ierr` from completing this request (status `sp`):
        its operation is over."""
        try:
            raise_recv_error(ierr, sp, recv_side(self), "buf")
        finally:
            ended_in_error(self)

    cdef inline int complete(self, object status) except -1:
        # a completed persistent request stays allocated (inactive), and keeps
        # its buffers; a completed non-blocking one lets them go
        status_type(status, self.rtype)
        finished(self)
        return 0

    def Wait(self, status=None):
        """Wait for completion.

        Parameters
        ----------
        status : mcr.Status, optional
            Filled with the status of the operation.

        Returns
        -------
        True

        Raises
        ------
        mcr.Exception
            If MPI reports an error.
        """
        cdef MPI_Status *sp = status_ptr(status)
        cdef MPI_Status own
        cdef int ierr
        cdef _Work w = self.ext       # (held: see completed_from)
        if self.obs is not None and least_limit(self.obs) > 0:
            return timed_wait(self, status)
        if w is not None:
            try:
                wait_work(w)
            except BaseException:
                work_raised(self)
                raise
            w.fill(status)
            completed_from(self, w)   # the request is inactive now
            return True
        if sp == MPI_STATUS_IGNORE and self.rtype != MPI_DATATYPE_NULL:
            sp = &own                 # a receive's status explains a truncation
        window = progress_enter()
        try:
            with nogil:
                ierr = MPI_Wait(&self.ob_mpi, sp)
        finally:
            progress_exit(window)
        if ierr != MPI_SUCCESS:
            self.failed(ierr, sp)
        self.complete(status)
        return True

    def Test(self, status=None):
        """Test for completion without blocking.

        Parameters
        ----------
        status : mcr.Status, optional
            Filled with the status of the operation when it has completed.

        Returns
        -------
        bool
            True when the operation has completed.
        """
        cdef MPI_Status *sp = status_ptr(status)
        cdef MPI_Status own
        cdef int flag = 0, ierr
        cdef _Work w
        progress_poll()
        w = self.ext
        if w is not None:
            if not tested_work(self, w):
                mpi_progress()
                return False
            w.fill(status)
            completed_from(self, w)
            return True
        if sp == MPI_STATUS_IGNORE and self.rtype != MPI_DATATYPE_NULL:
            sp = &own
        ierr = MPI_Test(&self.ob_mpi, &flag, sp)
        if ierr != MPI_SUCCESS:
            self.failed(ierr, sp)
        if flag:
            self.complete(status)
        return bool(flag)

    def Get_status(self, status=None):
        """Whether the operation has completed, without completing the request.

        Parameters
        ----------
        status : mcr.Status, optional
            Filled (counting elements) when the operation has completed.

        Returns
        -------
        bool
        """
        cdef MPI_Status *sp = status_ptr(status)
        cdef int flag = 0
        cdef _Work w = self.ext
        if w is not None:
            if w.test():
                w.fill(status)
                return True
            return False
        CHKERR(MPI_Request_get_status(self.ob_mpi, &flag, sp))
        if flag:
            status_type(status, self.rtype)
        return bool(flag)

    def Cancel(self):
        """Ask for the operation to be cancelled (MPI receives; see mpi4py).

        Raises
        ------
        ValueError
            For an operation on another backend than MPI, which cannot be
            cancelled.
        """
        if self.ext is not None:
            if self.ext.done:
                return None
            raise ValueError(f"request: an operation on backend {self.ext.backend!r} "
                             "cannot be cancelled")
        _MPI.Request.Cancel(self)

    def Free(self):
        """Release the request; the operation goes on, its buffers must not be
        touched until it would have completed."""
        if self.obs is not None:
            notify(self, OBS_FREED)                     # no longer waited for
        if self.ext is not None:
            if self.owner is not None:                  # settled when the work ends
                self.ext.owner, self.owner = self.owner, None
            detach(self.ext)
            self.ext = None
            self.ob_buf = None
            return None
        if holds_message(self):
            detach_mpi(self)         # MPI goes on with the buffers: keep them till then
            return None
        _MPI.Request.Free(self)

    def __bool__(self):
        return self.ob_mpi != MPI_REQUEST_NULL or self.ext is not None

    # mpi4py's ways to read the MPI handle. Once it has left the request, a
    # request made from it (fromhandle, f2py, fromint) or C code may complete
    # the operation, unseen here: MPI would free the handle the request still
    # holds, so mcr leaves the request alone when it is collected, as mpi4py
    # does (see lent)

    @property
    def handle(self):
        """MPI handle. Once it is read, a request collected before it completed
        is left alone, as in mpi4py (a copy made from the handle may complete
        it); see :doc:`requests`."""
        lent(self)
        return _MPI.Request.handle.__get__(self)

    def py2f(self):
        """Fortran handle (read: as ``handle``)."""
        lent(self)
        return _MPI.Request.py2f(self)

    def toint(self):
        """Translate object to integer handle (read: as ``handle``)."""
        lent(self)
        return _MPI.Request.toint(self)

    # a request alive without an MPI handle (a backend's work, an emulated
    # persistent request between starts) is equal only to itself and its
    # copies (Request(other)), not to REQUEST_NULL; the others compare their
    # handles, as in mpi4py
    def __eq__(self, other):
        if not isinstance(other, _MPI.Request):
            return NotImplemented
        if self is other:
            return True
        if ((self.ob_mpi == MPI_REQUEST_NULL and self)
                or ((<_MPI.Request>other).ob_mpi == MPI_REQUEST_NULL and other)):
            return isinstance(other, Request) and same_operation(self, <Request>other)
        return self.ob_mpi == (<_MPI.Request>other).ob_mpi

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    @classmethod
    def Waitall(cls, requests, statuses=None):
        """Wait for all requests to complete.

        Parameters
        ----------
        requests : sequence of Request
            The requests (inactive and null requests are allowed).
        statuses : list or tuple of Status, optional
            Filled with one status per request, as far as it goes; a list that
            is shorter is extended with new ``mcr.Status`` objects.

        Returns
        -------
        True

        Raises
        ------
        TypeError
            If an item of `requests` is not a request, or `statuses` is not a
            list or tuple of Status objects; before any request is waited for.
        mcr.Exception
            If MPI reports an error (``ERR_IN_STATUS``; a truncated receive is
            noted with the sizes, source and tag).
        """
        return completion(K_ALL, requests, statuses, True)

    @classmethod
    def Testall(cls, requests, statuses=None):
        """Test whether all requests have completed, without blocking.

        Parameters
        ----------
        requests : sequence of Request
        statuses : list or tuple of Status, optional
            Filled as in ``Waitall`` when all have completed.

        Returns
        -------
        bool
            True when every request has completed.
        """
        return completion(K_ALL, requests, statuses, False)

    @classmethod
    def Waitany(cls, requests, status=None):
        """Wait for any one of the requests to complete.

        Parameters
        ----------
        requests : sequence of Request
        status : mcr.Status, optional
            Filled with the status of the completed request.

        Returns
        -------
        int
            The index of the completed request, or ``UNDEFINED`` if none of
            `requests` is active.
        """
        return completion(K_ANY, requests, status, True)

    @classmethod
    def Testany(cls, requests, status=None):
        """Test whether any one of the requests has completed, without blocking.

        Returns
        -------
        tuple of (int, bool)
            ``(index, True)`` for a completed request, ``(UNDEFINED, True)`` if
            none is active, ``(UNDEFINED, False)`` if none has completed yet.
        """
        return completion(K_ANY, requests, status, False)

    @classmethod
    def Waitsome(cls, requests, statuses=None):
        """Wait for at least one of the requests to complete.

        Parameters
        ----------
        requests : sequence of Request
        statuses : list or tuple of Status, optional
            Its first entries are filled (a list is extended if shorter) with
            the statuses of the completed requests, in the order of the indices.

        Returns
        -------
        list of int or None
            The indices of the requests that completed, or None if none of
            `requests` is active.
        """
        return completion(K_SOME, requests, statuses, True)

    @classmethod
    def Testsome(cls, requests, statuses=None):
        """Like ``Waitsome`` without blocking: the list may be empty."""
        return completion(K_SOME, requests, statuses, False)

    @classmethod
    def Get_status_all(cls, requests, statuses=None):
        """Whether all requests have completed, without completing them
        (`statuses` filled as in ``Waitall`` when they have)."""
        return on_list(cls, L_GET_STATUS_ALL, requests, statuses)

    @classmethod
    def Get_status_any(cls, requests, status=None):
        """Whether any one request has completed, without completing it:
        ``(index, True)``, ``(UNDEFINED, True)`` if none is active, or
        ``(UNDEFINED, False)``."""
        return on_list(cls, L_GET_STATUS_ANY, requests, status)

    @classmethod
    def Get_status_some(cls, requests, statuses=None):
        """The indices of the requests that have completed, without
        completing them (None if none is active)."""
        return on_list(cls, L_GET_STATUS_SOME, requests, statuses)

    # -- mpi4py's lowercase methods (see pickled) --

    def wait(self, status=None):
        """Wait for completion, as mpi4py's ``wait``: the object of a receive
        on pickled objects (``comm.irecv``), else None."""
        if pickled(self):
            return pickled_wait(self, status)
        self.Wait(status)
        return None

    def test(self, status=None):
        """Test for completion, as mpi4py's ``test``: ``(flag, object)``."""
        if pickled(self):
            return tested_one(self, status)
        return self.Test(status), None

    def get_status(self, status=None):
        """Whether the operation has completed, without completing it."""
        return self.Get_status(status)

    def cancel(self):
        """Ask for the operation to be cancelled, as ``Cancel``."""
        self.Cancel()

    def free(self):
        """``Free`` if the request is not null."""
        if self:
            self.Free()

    @classmethod
    def waitall(cls, requests, statuses=None):
        """Wait for all requests, as mpi4py's ``waitall``: a list of their
        objects (received objects, else None)."""
        return on_list(cls, L_WAITALL, requests, statuses)

    @classmethod
    def testall(cls, requests, statuses=None):
        """As mpi4py's ``testall``: ``(flag, objects or None)``."""
        return on_list(cls, L_TESTALL, requests, statuses)

    @classmethod
    def waitany(cls, requests, status=None):
        """As mpi4py's ``waitany``: ``(index, object)``."""
        return on_list(cls, L_WAITANY, requests, status)

    @classmethod
    def testany(cls, requests, status=None):
        """As mpi4py's ``testany``: ``(index, flag, object)``."""
        return on_list(cls, L_TESTANY, requests, status)

    @classmethod
    def waitsome(cls, requests, statuses=None):
        """As mpi4py's ``waitsome``: ``(indices, objects)``, ``(None, None)``
        if none is active."""
        return on_list(cls, L_WAITSOME, requests, statuses)

    @classmethod
    def testsome(cls, requests, statuses=None):
        """As mpi4py's ``testsome``: ``(indices, objects)``."""
        return on_list(cls, L_TESTSOME, requests, statuses)

    @classmethod
    def get_status_all(cls, requests, statuses=None):
        """As ``Get_status_all``."""
        return cls.Get_status_all(requests, statuses)

    @classmethod
    def get_status_any(cls, requests, status=None):
        """As ``Get_status_any``."""
        return cls.Get_status_any(requests, status)

    @classmethod
    def get_status_some(cls, requests, statuses=None):
        """As ``Get_status_some``."""
        return cls.Get_status_some(requests, statuses)


# -- mpi4py's lowercase completion methods ---------------------------------------------
#
# mpi4py's own (wait, waitall, ...) complete only the MPI handle: on an mcr
# request they would return at once for a Gloo or NCCL operation, and skip
# what completing one does here (a staged result copied back, the logger's
# and the timeouts' records, the timeout itself). mcr's run its uppercase
# methods and return what mpi4py's return: the object of a receive on pickled
# objects (comm.irecv, from mpi4py or from a watched mcr.Comm), else None.
# Requests that need none of this go to mpi4py's own, unchanged.

cdef inline bint pickled(_MPI.Request req):
    """Whether `req` is one of mpi4py's operations on pickled objects (isend,
    irecv, ...), whose object mpi4py's lowercase methods unpickle."""
    name = type(req.ob_buf).__name__
    return name == "_p_req_buf" or name == "_p_req_obj"


cdef enum:                     # the class methods on lists that on_list runs
    L_WAITALL, L_TESTALL, L_WAITANY, L_TESTANY, L_WAITSOME, L_TESTSOME,
    L_GET_STATUS_ALL, L_GET_STATUS_ANY, L_GET_STATUS_SOME

# mpi4py's own, for lists with no mcr operation (bound once)
cdef tuple MPI4PY_ON_LIST = (_MPI.Request.waitall, _MPI.Request.testall,
                             _MPI.Request.waitany, _MPI.Request.testany,
                             _MPI.Request.waitsome, _MPI.Request.testsome,
                             _MPI.Request.Get_status_all, _MPI.Request.Get_status_any,
                             _MPI.Request.Get_status_some)


cdef object on_list(object cls, int kind, object requests, object st):
    """The class method `kind` (mpi4py's lowercase ones, Get_status_*) on
    `requests` with `st`, its status or statuses: mpi4py's own when no
    request needs mcr's completion; else mcr's uppercase method, with
    mpi4py's return values (objects None), or, when some of the requests are
    on pickled objects, tests one request at a time."""
    requests = listed(requests)
    if not needs_mcr(requests):
        return MPI4PY_ON_LIST[kind](requests, st)
    requests = as_requests(requests)
    if kind == L_WAITANY or kind == L_TESTANY or kind == L_GET_STATUS_ANY:
        check_status(st)
    else:
        check_statuses(st)
    if kind >= L_GET_STATUS_ALL:
        return statuses_of(requests, kind, st)
    if any_pickled(requests):
        if kind == L_WAITALL:
            return polled(requests, lambda: pickled_all(requests, st))
        if kind == L_TESTALL:
            return pickled_all(requests, st)
        if kind == L_WAITANY:
            return polled(requests, lambda: any_done(pickled_any(requests, st)))
        if kind == L_TESTANY:
            return pickled_any(requests, st)
        if kind == L_WAITSOME:
            return polled(requests, lambda: some_done(pickled_some(requests, st)))
        return pickled_some(requests, st)
    if kind == L_WAITALL:
        cls.Waitall(requests, st)
        return [None] * len(requests)
    if kind == L_TESTALL:
        flag = cls.Testall(requests, st)
        return flag, [None] * len(requests) if flag else None
    if kind == L_WAITANY:
        return cls.Waitany(requests, st), None
    if kind == L_TESTANY:
        index, flag = cls.Testany(requests, st)
        return index, flag, None
    indices = cls.Waitsome(requests, st) if kind == L_WAITSOME else cls.Testsome(requests, st)
    return indices, None if indices is None else [None] * len(indices)


cdef object statuses_of(list requests, int kind, object st):
    """Get_status_all, _any or _some on requests of which some need mcr's
    completion: non-destructive tests, one request at a time."""
    cdef Py_ssize_t room
    if kind == L_GET_STATUS_ALL:
        done = all([status_of(req, None) for req in requests])
        if done:
            for i in range(status_room(st, len(requests))):
                status_of(requests[i], st[i])
        return done
    if kind == L_GET_STATUS_ANY:
        active = False
        for i, req in enumerate(requests):
            if is_active(req):
                active = True
                if status_of(req, st):
                    return i, True
        if not active and st is not None:
            (<_MPI.Status>st).ob_mpi = empty_status_value()
        return MPI_UNDEFINED, not active
    indices = [i for i, req in enumerate(requests) if is_active(req) and status_of(req, None)]
    if not indices and not any([is_active(req) for req in requests]):
        return None
    room = status_room(st, len(indices))
    for k in range(room):
        status_of(requests[indices[k]], st[k])
    return indices


cdef inline object listed(object requests):
    """`requests` as given if a list or tuple (mpi4py checks its items),
    else as a checked list (an iterator is read once)."""
    if type(requests) is list or type(requests) is tuple:
        return requests
    return as_requests(requests)


cdef bint needs_mcr(object requests) except -1:
    """Whether a request of `requests` needs mcr's completion: an mcr
    operation (a backend's work, mcr's message), a watched one, or an
    emulated persistent one (between starts, MPI sees only a null handle)."""
    cdef Request r
    for req in requests:
        if isinstance(req, Request):
            r = <Request>req
            if r.ext is not None or r.obs is not None or type(r.ob_buf) is _Call:
                return True
            if isinstance(req, Prequest) and (<Prequest>req).start_fn is not None:
                return True
    return False


cdef bint any_pickled(list requests) except -1:
    for req in requests:
        if pickled(<_MPI.Request>req):
            return True
    return False


cdef bint status_of(object req, object status) except -1:
    """Non-destructive test of one request (Get_status)."""
    if isinstance(req, Request):
        return (<Request>req).Get_status(status)
    return _MPI.Request.Get_status(req, status)


cdef tuple tested_one(object req, object status):
    """Complete one request if it has completed: (flag, its object or None)."""
    cdef Request r
    if not isinstance(req, Request):
        return _MPI.Request.test(req, status)
    r = <Request>req
    if not pickled(r):
        return r.Test(status), None
    try:
        flag, obj = _MPI.Request.test(r, status)      # (unpickles a received object)
    except BaseException:
        if r.obs is not None:
            notify(r, OBS_FAILED)
        raise
    if flag and r.obs is not None:
        notify(r, OBS_DONE)
    return flag, obj


cdef object pickled_wait(Request req, object status):
    """wait on one of mpi4py's operations on pickled objects made an mcr
    Request (a watched comm.irecv, ...): polled with a timeout, else mpi4py's
    wait; its record ends with it."""
    if req.obs is not None and least_limit(req.obs) > 0:
        return polled([req], lambda: tested_one(req, status))
    try:
        obj = _MPI.Request.wait(req, status)
    except BaseException:
        if req.obs is not None:
            notify(req, OBS_FAILED)
        raise
    if req.obs is not None:
        notify(req, OBS_DONE)
    return obj


cdef object polled(list requests, object test):
    """Wait, in until_done, until `test()` -> (done, result) says done."""
    cdef _Turn turn = _Turn.__new__(_Turn)
    turn.test = test
    return until_done(requests, turn, True, requests_limit(requests))


cdef tuple pickled_all(list requests, object statuses):
    """testall over requests among which some are pickled: completes none
    until all have completed (non-destructive tests first), as MPI_Testall."""
    cdef Py_ssize_t n = len(requests)
    cdef Py_ssize_t room = status_room(statuses, n)
    for i in range(n):
        if not status_of(requests[i], None):
            mpi_progress()
            return False, None
    objects = [tested_one(requests[i], statuses[i] if i < room else None)[1]
               for i in range(n)]
    return True, objects


cdef tuple pickled_any(list requests, object status):
    """testany over requests among which some are pickled: (index, flag, object)."""
    cdef bint active = False
    for i, req in enumerate(requests):
        if is_active(req):
            active = True
            if status_of(req, None):
                flag, obj = tested_one(req, status)
                return i, True, obj
    if active:
        mpi_progress()
        return MPI_UNDEFINED, False, None
    if status is not None:
        (<_MPI.Status>status).ob_mpi = empty_status_value()
    return MPI_UNDEFINED, True, None


cdef tuple pickled_some(list requests, object statuses):
    """testsome over requests among which some are pickled: (indices, objects),
    (None, None) when none is active."""
    indices = [i for i, req in enumerate(requests) if is_active(req) and status_of(req, None)]
    if not indices:
        if not any([is_active(req) for req in requests]):
            return None, None
        mpi_progress()
        return [], []
    cdef Py_ssize_t room = status_room(statuses, len(indices))
    objects = [tested_one(requests[i], statuses[k] if k < room else None)[1]
               for k, i in enumerate(indices)]
    return indices, objects


cdef MPI_Status empty_status_value() noexcept:
    if not empty_ready:
        init_empty_status()
    return empty_status


cdef tuple any_done(tuple tested):
    index, flag, obj = tested
    return flag, (index, obj)


cdef tuple some_done(tuple tested):
    indices, objects = tested
    return indices is None or len(indices) > 0, (indices, objects)


cdef MPI_Status empty_status      # what a status holds where MPI writes none
cdef bint empty_ready = False


cdef int init_empty_status() except -1:
    """The empty status (source ANY_SOURCE, tag ANY_TAG, no element), as
    mpi4py gives for a request whose status MPI leaves alone: MPICH writes
    none for a send completed among others."""
    global empty_ready
    memset(&empty_status, 0, sizeof(MPI_Status))
    set_status(&empty_status, MPI_ANY_SOURCE, MPI_ANY_TAG, 0)
    empty_ready = True
    return 0


cdef enum:
    SMALL_LIST = 4             # lists of up to this many requests are completed without malloc


cdef int twice(Py_ssize_t i, Py_ssize_t j) except -1:
    raise ValueError(f"requests[{j}]: the same request as requests[{i}]; pass each request "
                     "once (MPI completes it once)")


cdef int check_distinct(list requests) except -1:
    """Refuse an active MPI request passed twice (MPI would complete it once
    and then wait on its freed handle), before anything is waited for. The
    null request may repeat, and so may an inactive persistent one (it counts
    as complete) and a handle: Open MPI gives every operation with PROC_NULL
    the same one (the check is by object)."""
    cdef Py_ssize_t i, j, n = len(requests)
    cdef dict seen
    if n <= 16:                             # (a few comparisons cost less than a dict)
        for j in range(1, n):
            if (<_MPI.Request>requests[j]).ob_mpi != MPI_REQUEST_NULL:
                for i in range(j):
                    if requests[i] is requests[j] and not inactive_persistent(requests[j]):
                        twice(i, j)
        return 0
    seen = {}
    for j in range(n):
        if (<_MPI.Request>requests[j]).ob_mpi != MPI_REQUEST_NULL:
            i = seen.setdefault(id(requests[j]), j)
            if i != j and not inactive_persistent(requests[j]):
                twice(i, j)
    return 0


cdef bint inactive_persistent(object req) noexcept:
    """Whether `req`, holding an MPI handle, is one of mcr's persistent
    requests that MPI runs (an emulated one holds a handle only while
    active) and is not started, or completed since its last start: it counts
    from its start until it is seen complete for its communicator (owner,
    see Prequest.start and settle)."""
    return (isinstance(req, Prequest) and (<Prequest>req).start_fn is None
            and (<Prequest>req).owner is None)


cdef bint is_active(object req) except -1:
    """Whether `req` is active: not null, and no persistent request between
    its starts (those count as complete, with an empty status)."""
    cdef Prequest p
    if not req:
        return False
    if isinstance(req, Prequest):
        p = <Prequest>req
        if p.start_fn is not None:
            return p.ob_mpi != MPI_REQUEST_NULL or p.ext is not None
        return not inactive_persistent(p)
    return True


@cython.no_gc             # (holds a list of requests, which never refer back to it)
@cython.freelist(4)
cdef class _Handles:
    """The MPI_Request handles of a list of requests, with room for statuses
    and indices; `put_back` returns the handles and releases what completed.
    `requests` must be a list of MPI.Request (as_requests checked it)."""
    cdef list requests
    cdef int n
    cdef MPI_Request *handles
    cdef MPI_Status *statuses
    cdef int *indices
    # a few requests (the common case) need no allocation
    cdef MPI_Request few_handles[SMALL_LIST]
    cdef MPI_Status few_statuses[SMALL_LIST]
    cdef int few_indices[SMALL_LIST]

    def __cinit__(self, list requests):
        self.requests = requests
        self.n = <int>len(requests)
        cdef Py_ssize_t i, room = max(self.n, 1)
        if room <= SMALL_LIST:
            self.handles, self.statuses, self.indices = \
                self.few_handles, self.few_statuses, self.few_indices
        else:
            self.handles = <MPI_Request*>PyMem_Malloc(room * sizeof(MPI_Request))
            self.statuses = <MPI_Status*>PyMem_Malloc(room * sizeof(MPI_Status))
            self.indices = <int*>PyMem_Malloc(room * sizeof(int))
            if self.handles == NULL or self.statuses == NULL or self.indices == NULL:
                raise MemoryError
        if not empty_ready:
            init_empty_status()
        for i in range(self.n):
            self.handles[i] = (<_MPI.Request>requests[i]).ob_mpi
            self.statuses[i] = empty_status

    def __dealloc__(self):
        if self.handles != self.few_handles:
            PyMem_Free(self.handles)
            PyMem_Free(self.statuses)
            PyMem_Free(self.indices)

    cdef int put_back(self, bint all_done, object completed=(), object failed=()) except -1:
        """Return the handles; release the buffers of the requests that
        completed: all (`all_done`), or those in `completed` (indices); those
        in `failed` ended in an error."""
        cdef _MPI.Request req
        cdef Py_ssize_t i
        for i in range(self.n):
            req = <_MPI.Request>self.requests[i]
            req.ob_mpi = self.handles[i]
            if all_done or (completed and i in completed):
                finished(req)
            elif failed and i in failed and isinstance(req, Request):
                ended_in_error(<Request>req)
        return 0

    cdef int put_back_after(self, int ierr, int count, bint by_index) except -1:
        """Return the handles after MPI's error `ierr`. With MPI_ERR_IN_STATUS,
        the first `count` statuses (of the requests in self.indices, or of all
        in order) say which requests completed and which failed; the others
        are still pending."""
        done, failed = set(), set()
        for k in range(count if ierr == MPI_ERR_IN_STATUS else 0):
            i = self.indices[k] if by_index else k
            if self.statuses[k].MPI_ERROR == MPI_SUCCESS:
                done.add(i)
            elif self.statuses[k].MPI_ERROR != MPI_ERR_PENDING:
                failed.add(i)
        return self.put_back(False, done, failed)

    cdef int fill_status(self, object status, int index, int k) except -1:
        """Copy the status of requests[index] (k-th in self.statuses) into `status`."""
        (<_MPI.Status>status).ob_mpi = self.statuses[k]
        req = self.requests[index]
        status_type(status, (<Request>req).rtype if isinstance(req, Request)
                    else MPI_DATATYPE_NULL)
        return 0

    cdef int fill_list(self, object statuses, int count, bint by_index) except -1:
        for k in range(status_room(statuses, count)):
            self.fill_status(statuses[k], self.indices[k] if by_index else k, k)
        return 0

    cdef object error(self, int ierr, int count, int index):
        """MPI's error `ierr` from completing the requests, to raise once the
        handles are put back; a truncation names its request: `index` (its
        status first in self.statuses), or the `count` statuses of the
        requests in self.indices (Waitsome) or all (index -2)."""
        exc = Exception(ierr)
        if index >= 0:
            note_truncation(exc, ierr, &self.statuses[0], recv_side(self.requests[index]),
                            f"requests[{index}]")
            return exc
        for k in range(count):
            i = k if index == -2 else self.indices[k]
            note_truncation(exc, self.statuses[k].MPI_ERROR, &self.statuses[k],
                            recv_side(self.requests[i]), f"requests[{i}]")
        return exc


cdef list as_requests(object requests):
    """`requests` as a new list (another thread may change the caller's while
    a wait has let go of the GIL), each item checked to be a request, before
    any of them is waited for."""
    cdef list found
    try:
        found = list(requests)
    except TypeError:
        raise TypeError("requests: expected a sequence of MPI.Request, got "
                        f"{type(requests).__name__}") from None
    cdef Py_ssize_t i
    for i in range(len(found)):
        if not isinstance(found[i], _MPI.Request):
            raise TypeError(f"requests[{i}]: expected an MPI.Request, got "
                            f"{type(found[i]).__name__}")
    return found


cdef side *recv_side(object req) noexcept:
    """The receive side of a request's message (NULL: not a receive, or gone)."""
    if not isinstance(req, Request) or (<Request>req).rtype == MPI_DATATYPE_NULL:
        return NULL
    buf = (<Request>req).ob_buf
    return &(<_Call>buf).r if type(buf) is _Call else NULL


cdef int copy_status(object status, object source) except -1:
    (<_MPI.Status>status).ob_mpi = (<_MPI.Status>source).ob_mpi
    status_type(status, (<Status>source).rtype if isinstance(source, Status)
                else MPI_DATATYPE_NULL)
    return 0


cdef bint persistent_collectives(list requests) except -1:
    """Whether `requests` holds a persistent collective request, on an MPI
    library whose MPI_Testall and MPI_Waitall report MPI_ERR_IN_STATUS for them
    with every status MPI_SUCCESS (MPICH 5.0.2; mpi4py alone shows it)."""
    if not library_is_mpich():
        return False
    for r in requests:
        if is_persistent_collective(r):
            return True
    return False


cdef inline bint is_persistent_collective(object r) noexcept:
    return isinstance(r, Prequest) and (<Prequest>r).op > CALL_BARRIER


cdef int each_all(_Handles h, bint wait, int *flag) except? -1:
    """MPI_Waitall or MPI_Testall around MPICH's error: the persistent
    collectives are tested with MPI_Request_get_status (which completes
    nothing), the other requests with one MPI_Testall, so that a test still
    completes all or nothing; then each is completed with MPI_Wait. An error
    is reported as MPI_ERR_IN_STATUS, as MPI_Waitall does."""
    cdef int i, k, m = 0, done = 0, ierr = MPI_SUCCESS
    cdef list rest = [i for i in range(h.n) if not is_persistent_collective(h.requests[i])]
    cdef MPI_Request *handles
    cdef MPI_Status *statuses
    flag[0] = 1
    if not wait:
        for i in range(h.n):
            if is_persistent_collective(h.requests[i]):
                CHKERR(MPI_Request_get_status(h.handles[i], &done, MPI_STATUS_IGNORE))
                if not done:
                    flag[0] = 0
                    return MPI_SUCCESS
        m = len(rest)
        handles = <MPI_Request*>PyMem_Malloc((m + 1) * sizeof(MPI_Request))
        statuses = <MPI_Status*>PyMem_Malloc((m + 1) * sizeof(MPI_Status))
        if handles == NULL or statuses == NULL:
            PyMem_Free(handles)
            PyMem_Free(statuses)
            raise MemoryError()
        for k in range(m):
            handles[k] = h.handles[<int>rest[k]]
            statuses[k] = h.statuses[<int>rest[k]]
        ierr = MPI_Testall(m, handles, flag, statuses)
        for k in range(m):
            h.handles[<int>rest[k]] = handles[k]
            h.statuses[<int>rest[k]] = statuses[k]
        PyMem_Free(handles)
        PyMem_Free(statuses)
        if ierr != MPI_SUCCESS or not flag[0]:
            return ierr
    for i in range(h.n):
        if not wait and not is_persistent_collective(h.requests[i]):
            continue                    # completed by the MPI_Testall above
        with nogil:
            ierr = MPI_Wait(&h.handles[i], &h.statuses[i])
        if ierr != MPI_SUCCESS:
            for k in range(h.n):
                h.statuses[k].MPI_ERROR = MPI_SUCCESS if k < i else ierr if k == i \
                    else MPI_ERR_PENDING
            return MPI_ERR_IN_STATUS
    return MPI_SUCCESS


cdef object complete_all(object requests, object statuses, bint wait):
    cdef _Handles h = _Handles(requests)
    cdef int flag = 1, ierr
    if mpich and persistent_collectives(h.requests):    # (mpich -1: not asked yet)
        ierr = each_all(h, wait, &flag)
    elif wait:
        with nogil:
            ierr = MPI_Waitall(h.n, h.handles, h.statuses)
    else:
        ierr = MPI_Testall(h.n, h.handles, &flag, h.statuses)
    if ierr != MPI_SUCCESS:
        exc = h.error(ierr, h.n, -2)
        h.put_back_after(ierr, h.n, False)
        if ierr == MPI_ERR_IN_STATUS:       # (each request's error, as in mpi4py)
            h.fill_list(statuses, h.n, False)
        raise exc
    h.put_back(flag)
    if not flag:
        return False
    h.fill_list(statuses, h.n, False)
    return True


cdef object complete_any(object requests, object status, bint wait):
    cdef _Handles h = _Handles(requests)
    cdef int index = MPI_UNDEFINED, flag = 1, ierr
    if wait:
        with nogil:
            ierr = MPI_Waitany(h.n, h.handles, &index, h.statuses)
    else:
        ierr = MPI_Testany(h.n, h.handles, &index, &flag, h.statuses)
    if ierr != MPI_SUCCESS:         # (the request at `index` failed)
        exc = h.error(ierr, 0, index if index != MPI_UNDEFINED else -1)
        h.put_back(False, (), (index,) if index != MPI_UNDEFINED else ())
        raise exc
    h.put_back(False, (index,) if flag and index != MPI_UNDEFINED else ())
    if flag and status is not None:
        if index != MPI_UNDEFINED:
            h.fill_status(status, index, 0)
        else:
            (<_MPI.Status>status).ob_mpi = h.statuses[0]    # the empty status
    return index if wait else (index, bool(flag))


cdef object complete_some(object requests, object statuses, bint wait):
    cdef _Handles h = _Handles(requests)
    cdef int outcount = MPI_UNDEFINED, ierr
    if wait:
        with nogil:
            ierr = MPI_Waitsome(h.n, h.handles, &outcount, h.indices, h.statuses)
    else:
        ierr = MPI_Testsome(h.n, h.handles, &outcount, h.indices, h.statuses)
    if ierr != MPI_SUCCESS:
        exc = h.error(ierr, max(outcount, 0), -1)
        h.put_back_after(ierr, outcount, True)
        if ierr == MPI_ERR_IN_STATUS:
            h.fill_list(statuses, outcount, True)
        raise exc
    h.put_back(False, () if outcount == MPI_UNDEFINED else
               {h.indices[k] for k in range(outcount)})
    if outcount == MPI_UNDEFINED:
        return None
    h.fill_list(statuses, outcount, True)
    return [h.indices[k] for k in range(outcount)]


# Requests with a non-MPI part (Gloo, NCCL, staged work) mixed with MPI ones:
# the MPI requests go through the functions above as a group; the others are
# polled, and every turn of a waiting loop drives MPI (progress.pxi).

cdef inline _Work work_of(object req):
    if type(req) is Request or type(req) is Prequest:
        return (<Request>req).ext
    if isinstance(req, Request):
        return (<Request>req).ext
    return None


cdef int completed(Request req) except -1:
    """The caller has been told `req`, of backend works, completed: it
    becomes inactive."""
    req.ext = None
    req.ob_buf = None
    finished(req)
    return 0


cdef int completed_from(Request req, _Work w) except -1:
    """The caller saw `w`, the work of `req` when it began, complete (and
    filled its status from `w`): `req` becomes inactive, unless another thread
    completed it meanwhile. Completing a request from two threads is
    erroneous in MPI; here it ends with both callers told it completed, and
    its completion seen once. (While a wait or a test lets go of the GIL,
    `req.ext` may become None or, once a persistent request is started
    again, another work: callers hold `w`, never read `req.ext` again.)"""
    if req.ext is w:
        completed(req)
    return 0


cdef int finished(_MPI.Request req) except -1:
    """The one place a request's completion is seen (Wait, Test and the
    class methods alike): a staged result is copied back, the buffers of a
    non-persistent request let go, its observers (the logger's record, the
    call's record for timeouts and the flight recorder) and the
    communicator's count of pending operations told."""
    release_buffers(req)
    if not isinstance(req, Request):
        return 0
    cdef Request r = <Request>req
    if r.obs is not None:
        notify(r, OBS_DONE)
    if r.owner is not None:
        settle(r)
    return 0


cdef _Observer notify(Request req, int how):
    """Tell `req`'s observers how its operation ended (OBS_*); those that
    stay attached stay on `req` for OBS_DONE and OBS_FAILED, and are
    returned (taken off `req`) for OBS_FREED and OBS_DROPPED."""
    head, req.obs = req.obs, None
    kept = notify_all(head, how)
    if how == OBS_DONE or how == OBS_FAILED:
        req.obs = kept
    return kept


cdef inline int observe(Request req, _Observer o) except -1:
    """Attach observer `o` to `req`."""
    req.obs = linked(req.obs, o)
    return 0


cdef double requests_limit(object requests) except -1:
    """The shortest time limit of the observers of `requests` (0: none)."""
    cdef double t = 0, x
    for r in requests:
        if isinstance(r, Request) and (<Request>r).obs is not None:
            x = least_limit((<Request>r).obs)
            if x > 0 and (t == 0 or x < t):
                t = x
    return t


cdef int ended_in_error(Request req) except -1:
    """A wait or test of `req` raises its operation's error: the operation is
    over, so its observers and its communicator are told now, not when the
    program lets the request go; a request of backend work becomes inactive,
    as MPI's does (a persistent one can be started again)."""
    if req.obs is not None:
        notify(req, OBS_FAILED)
    if req.owner is not None:
        settle(req)
    if req.ext is not None:
        req.ext = None
        req.ob_buf = None
    return 0


cdef bint tested_work(Request req, _Work w) except -1:
    """Whether `w`, the backend work of `req`, is complete (`_Work.test`)."""
    try:
        return w.test()
    except BaseException:
        work_raised(req)
        raise


cdef int work_raised(Request req) except -1:
    """A wait or test of the backend work of `req` raised: if the work failed
    (not an interrupt while waiting), the operation ended in that error."""
    if req.ext is not None and req.ext.failed:
        ended_in_error(req)
    return 0


cdef inline int owned_by(Request req, Comm comm) noexcept:
    """`req` is an operation of `comm` yet to complete: Free leaves `comm`
    to MPI until it has (settle)."""
    req.owner = comm
    comm.pending += 1
    return 0


cdef object pending_on(Comm comm, object result):
    """`result`, what a non-blocking call on `comm` returned: a Request that
    nothing counts yet counts as pending on `comm`, whatever made it (an
    interceptor; mpi4py's request of a neighbourhood collective; stages on
    private copies of `comm`), so that Free leaves `comm` to MPI until it
    completes."""
    if isinstance(result, Request) and (<Request>result).owner is None:
        owned_by(<Request>result, comm)
    return result


cdef int settle(Request req) except -1:
    """The operation of `req` is over: its communicator has one pending
    operation less."""
    owner, req.owner = req.owner, None
    return one_less_pending(<Comm>owner)


cdef inline int one_less_pending(Comm comm) except -1:
    """An operation of `comm` is over: it is freed now if Free was waiting
    for that."""
    comm.pending -= 1
    if comm.pending == 0 and comm.deferred != MPI_COMM_NULL:
        MPI_Comm_free(&comm.deferred)
    return 0


cdef int detach_mpi(Request req) except -1:
    """Free a request whose operation may go on (freed or dropped before it
    completes): a stand-in request keeps the handle and the message (the
    buffers, a staged result to copy back), and is completed in the
    background, like the works of freed requests (an inactive persistent
    request is then freed, when the stand-in goes: see dropped)."""
    cdef Request keeper = Request.__new__(Request)
    keeper.ob_mpi, req.ob_mpi = req.ob_mpi, MPI_REQUEST_NULL
    keeper.ob_buf, req.ob_buf = req.ob_buf, None
    if req.obs is not None:
        keeper.obs = notify(req, OBS_DROPPED)   # (those that follow the operation)
    keeper.owner, req.owner = req.owner, None
    cdef _Work w = _Work.__new__(_Work)
    w.backend = "mpi"
    w.works = [_Tested(keeper)]
    w.steps = []
    detach(w)
    return 0


cdef inline bint holds_message(Request req):
    """Whether `req` alone holds an MPI handle with mcr's message (buffers)
    to keep until the operation completes (Free hands both to detach_mpi)."""
    return req.ob_mpi != MPI_REQUEST_NULL and type(req.ob_buf) is _Call and not req.shared


cdef int copied(Request req, object other) except -1:
    """`req` was made from `other` (mpi4py's ``Request(other)``, a subclass
    wrapping a request): both hold one operation, so neither may complete it
    on its own when collected. From an mcr request, the copy shares its
    backend work (either completes it, once) and, from a persistent one, what
    it starts; it takes over the request's observers (timeouts, the flight
    recorder, the logger) and its communicator's count, since a copy is what
    the program goes on with (Prequest's __cinit__ copies the rest). The
    original completed instead, the copy gives them back or ends them when
    it goes (see dropped)."""
    req.shared = True
    if not isinstance(other, Request):
        return 0
    cdef Request o = <Request>other
    o.shared = True
    req.rtype, req.ext, req.twin = o.rtype, o.ext, o
    req.obs, o.obs = o.obs, None
    req.owner, o.owner = o.owner, None
    return 0


cdef inline int lent(Request req) noexcept:
    """The MPI handle of `req` was read (``handle``, ``py2f``, ``toint``,
    mcr.MPI's ``_handleof``, ``_addressof``): like a copy, the request no
    longer completes its operation by itself when it is collected (see
    dropped)."""
    req.shared = True
    return 0


def _lend_handle(Request req):
    """Note that the MPI handle of `req` is read outside it (mcr.MPI's
    ``_handleof``, ``_addressof``), as its ``handle`` does."""
    lent(req)


cdef bint same_operation(Request a, Request b) noexcept:
    """Whether `a` and `b`, one alive without an MPI handle, hold one
    operation: one is a copy of the other (see copied)."""
    if a.ext is not None and a.ext is b.ext:
        return True
    return (isinstance(a, Prequest) and isinstance(b, Prequest)
            and (<Prequest>a).start_fn is not None
            and (<Prequest>a).start_fn is (<Prequest>b).start_fn)


cdef int twin_done(Request req) except -1:
    """`req`, a copy, goes before it completed its operation: where its
    original completed the operation, the copy's observers and count end now;
    where the original still holds it, they go back to the original."""
    cdef Request o = req.twin
    req.twin = None
    if req.obs is None and req.owner is None:
        return 0
    if o.ob_mpi == MPI_REQUEST_NULL and o.ext is None and not isinstance(o, Prequest):
        if req.obs is not None:
            notify_all(notify(req, OBS_DROPPED), OBS_DONE)
        if req.owner is not None:
            settle(req)
        return 0
    o.obs, req.obs = joined(req.obs, o.obs), None
    if o.owner is None:
        o.owner, req.owner = req.owner, None
    return 0


cdef void dropped(Request req) noexcept:
    """`req` is collected before its operation was seen to complete (the
    request dropped, an error between posting and waiting). MPI frees nothing
    by itself and mpi4py leaks the handle, but lets the buffers go while MPI
    still sends from them or receives into them. Here, the operation is kept
    with the works of freed requests (message and all) until it completes,
    and its call's record (timeouts, flight recorder) stays pending till
    then (a wait that timed out drops its request so); an inactive persistent
    request is freed. Nothing is done for the operation of a copy
    (``Request(other)``: the other object completes it) or of a request whose
    handle was read (see lent): a copy made from the handle may have
    completed it; their observers and their communicator's count end (a
    copy's go back to its original). Nothing at all is done once MPI is
    finalized."""
    cdef int finalized = 1, flag = 0, ierr
    cdef MPI_Status st
    MPI_Finalized(&finalized)
    if finalized:
        return
    if exiting:
        # Python is tearing its modules down (a request left pending in a
        # module's globals at exit): nothing can be waited for or warned
        # about any more, and MPI is finalized next. Its buffers are kept.
        if req.ob_buf is not None:
            Py_INCREF(req.ob_buf)
        if req.ext is not None:
            Py_INCREF(req.ext)
        return
    cdef _Work w = req.ext
    if w is not None:
        if w.failed:                        # its wait raised: nothing left to do
            ended_in_error(req)             # (if that wait did not already)
        else:
            if req.obs is not None:             # (those that follow it till the work is over)
                w.obs = joined(notify(req, OBS_DROPPED), w.obs)
            if req.owner is not None:
                w.owner, req.owner = req.owner, None
            detach(w)                       # (settled at once if nothing is left to wait for)
        return
    if req.shared:
        if req.twin is not None:
            twin_done(req)
        else:
            out_of_sight(req)
        return
    if req.ob_mpi == MPI_REQUEST_NULL:
        return
    ierr = MPI_Test(&req.ob_mpi, &flag, &st)
    if ierr != MPI_SUCCESS:             # it failed (and MPI freed it)
        try:
            req.failed(ierr, &st)       # (its observers and communicator told)
        except _builtins.Exception as exc:
            lost_error("mpi", exc)
        return
    if not flag:
        detach_mpi(req)                 # (its observers that follow it go with it)
        return
    if req.obs is not None:             # (a dropped request is not logged as done)
        notify_all(notify(req, OBS_DROPPED), OBS_DONE)
    if type(req.ob_buf) is _Call and (<_Call>req.ob_buf).staged is not None:
        unstage(<_Call>req.ob_buf)
    if req.ob_mpi != MPI_REQUEST_NULL:  # an inactive persistent request
        MPI_Request_free(&req.ob_mpi)
    if req.owner is not None:           # (Free may be waiting for it)
        settle(req)


cdef int out_of_sight(Request req) except -1:
    """`req`, whose handle was read (lent), goes: what may follow its
    operation on, a copy made from the handle, is not mcr's, so its call's
    record ends (as done: in the pending calls it would stay forever) and its
    communicator's count too."""
    if req.obs is not None:
        notify_all(notify(req, OBS_DROPPED), OBS_DONE)
    if req.owner is not None:
        settle(req)
    return 0


cdef class _Tested:
    """An MPI request as a work handle (is_completed runs Test)."""
    cdef Request req

    def __cinit__(self, Request req):
        self.req = req

    def is_completed(self):
        return self.req.Test()

    def wait(self):
        pass


cdef class _Poll:
    """One turn of polling the works of a list of requests. Requests whose
    work waits on the same single handle (the calls of one mcr.Fusion bucket)
    ask it once per turn: once it says "not yet", the others are not asked
    again in that turn."""
    cdef object pending          # a handle that said "not yet" this turn

    cdef bint test(self, object req, _Work w) except -1:
        """Whether `w`, the work of `req`, is complete."""
        if w.done:
            return True
        if len(w.works) == 1 and w.works[0] is self.pending:
            return False
        if tested_work(<Request>req, w):
            return True
        if len(w.works) == 1:
            self.pending = w.works[0]
        return False


cdef bint has_work(object requests) except -1:
    for req in requests:
        if work_of(req) is not None:
            return True
    return False


cdef tuple split_work(list requests):
    """({index: its _Work} of the requests with one, in order; indices of the
    MPI-only ones). The works are taken once: another thread may complete a
    request while a turn lets go of the GIL (see completed_from)."""
    cdef dict works = {}
    cdef list plain = []
    cdef _Work w
    for i, req in enumerate(requests):
        if not isinstance(req, _MPI.Request):
            raise TypeError(f"requests[{i}]: expected an MPI.Request, got "
                            f"{type(req).__name__}")
        w = work_of(req)
        if w is not None:
            works[i] = w
        else:
            plain.append(i)
    return works, plain


cdef enum:                     # what a completion class method completes
    K_ALL, K_ANY, K_SOME


cdef object completion(int kind, object requests, object st, bint wait):
    """Waitall, Testall, Waitany, Testany, Waitsome, Testsome (`kind`,
    `wait`) on `requests`, `st` their status or statuses. Requests of MPI
    alone, with no time limit, complete in one MPI call (a wait blocks in
    MPI, in the progress engine's window); any other list is polled, one
    turn at a time, in until_done."""
    if not wait:
        progress_poll()
    requests = as_requests(requests)
    if len(requests) > 1:
        check_distinct(requests)
    if kind == K_ANY:
        check_status(st)
    else:
        check_statuses(st)
    cdef double limit = requests_limit(requests) if wait else 0
    if not has_work(requests) and limit == 0:
        window = progress_enter() if wait else None
        try:
            if kind == K_ALL:
                return complete_all(requests, st, wait)
            if kind == K_ANY:
                return complete_any(requests, st, wait)
            return complete_some(requests, st, wait)
        finally:
            progress_exit(window)
    cdef _Turn turn = _Turn.__new__(_Turn)
    turn.kind, turn.requests, turn.st, turn.wait = kind, requests, st, wait
    turn.works, turn.plain = split_work(requests)
    turn.ready = wait and limit == 0
    return until_done(requests, turn, wait, limit)


cdef int waited_ready(list requests, dict works) except -1:
    """Waitall, Waitany and Waitsome, at each turn: wait, without polling, for
    the works that need no driving (``_Work.wait_ready_works``: a
    stream-ordered NCCL collective, a receive whose header has matched), as
    Wait does. `works`: {index in `requests`: its _Work}."""
    cdef _Work w
    for i, w in works.items():
        try:
            w.wait_ready_works()
        except BaseException:
            work_raised(<Request>requests[i])
            raise
    return 0


cdef class _Turn:
    """One turn of completing a list of requests: `step` tests each once
    (no blocking) and returns (done, the class method's result)."""
    cdef int kind
    cdef list requests, plain            # all; indices of those without a _Work
    cdef dict works                      # {index: its _Work} of the others (split_work)
    cdef object st
    cdef bint wait
    cdef bint ready                      # a wait with no time limit: waited_ready each turn
    cdef object test                     # the step of a Python test function (see polled)

    cdef tuple step(self):
        if self.test is not None:
            return self.test()
        if self.kind == K_ALL:
            return self.all_step()
        if self.kind == K_ANY:
            return self.any_step()
        return self.some_step()

    cdef tuple all_step(self):
        requests, works, plain = self.requests, self.works, self.plain
        if self.ready:
            waited_ready(requests, works)
        if not all_tested(requests, works):
            mpi_progress()
            return False, False
        sub = [] if self.st is not None else None
        if not complete_all([requests[i] for i in plain], sub, False):
            return False, False
        cdef Py_ssize_t room = status_room(self.st, len(requests))
        for k, i in enumerate(plain):
            if i < room:
                copy_status(self.st[i], sub[k])
        for i in works:
            if i < room:
                (<_Work>works[i]).fill(self.st[i])
        for i in works:
            completed_from(requests[i], works[i])
        return True, True

    cdef tuple any_step(self):
        requests, works, plain = self.requests, self.works, self.plain
        if self.ready:
            waited_ready(requests, works)
        cdef _Poll poll = _Poll.__new__(_Poll)
        for i in works:
            if poll.test(requests[i], works[i]):
                (<_Work>works[i]).fill(self.st)
                completed_from(requests[i], works[i])
                return True, self.any_result(i, True)
        index, flag = complete_any([requests[i] for i in plain], self.st, False)
        if flag and index != MPI_UNDEFINED:
            return True, self.any_result(plain[index], True)
        if flag and not works:        # nothing active at all
            return True, self.any_result(MPI_UNDEFINED, True)
        mpi_progress()
        return False, (MPI_UNDEFINED, False)

    cdef object any_result(self, object index, bint flag):
        return index if self.wait else (index, flag)

    cdef tuple some_step(self):
        requests, works, plain, statuses = self.requests, self.works, self.plain, self.st
        if self.ready:
            waited_ready(requests, works)
        cdef _Poll poll = _Poll.__new__(_Poll)
        done = [i for i in works if poll.test(requests[i], works[i])]
        sub = [] if statuses is not None else None
        got = complete_some([requests[i] for i in plain], sub, False)
        if got is None and not works:
            return True, None
        finished = sorted(done + [plain[k] for k in (got or [])])
        if statuses is not None:
            from_mpi = {plain[k]: st for k, st in zip(got or [], sub)}
            for pos in range(status_room(statuses, len(finished))):
                i = finished[pos]
                if i in from_mpi:
                    copy_status(statuses[pos], from_mpi[i])
                else:
                    (<_Work>works[i]).fill(statuses[pos])
        for i in done:
            completed_from(requests[i], works[i])
        if not finished:
            mpi_progress()
        return bool(finished), finished


cdef bint all_tested(list requests, dict works) except -1:
    """Test `works`, {index in `requests`: its _Work} (each distinct one,
    every turn); whether all are complete."""
    cdef _Poll poll = _Poll.__new__(_Poll)
    cdef bint done = True
    for i in works:
        if not poll.test(requests[i], works[i]):
            done = False
    return done


cdef object until_done(list requests, _Turn turn, bint wait, double limit):
    """The one loop of the completion methods (the class methods, mpi4py's
    lowercase ones on pickled objects, a Wait with a time limit): a test
    runs one turn; a wait runs turns until one completes, driving MPI,
    freed requests' works and the progress engine between them (idle),
    within `limit` seconds (0: none; the shortest limit of the requests'
    observers: TimeoutError naming the requests still pending)."""
    cdef long long deadline = deadline_ns(limit)
    cdef int spins = 0
    while True:
        done, result = turn.step()
        if done or not wait:
            return result
        if limit > 0 and now_ns() > deadline:
            timed_out(requests, limit)
        idle(spins)
        spins += 1


# Persistent requests. MPI-4 persistent collectives are used where the library
# has them (include/mcr/dispatch.h); elsewhere, or when tests ask for it, a
# Prequest emulates them by posting the non-blocking form at each Start.

cdef bint emulate_persistent = not HAVE_PERSISTENT_COLL


def _set_persistent_emulation(bint on):
    """Emulate persistent collectives with non-blocking ones (for tests); return
    the previous setting."""
    global emulate_persistent
    previous = emulate_persistent
    emulate_persistent = on or not HAVE_PERSISTENT_COLL
    return previous


cdef MPI_Info as_info(object info) except? NULL:
    if info is None:
        return MPI_INFO_NULL
    if not isinstance(info, _MPI.Info):
        raise TypeError(f"info: expected an MPI.Info or None, got {type(info).__name__}")
    return (<_MPI.Info>info).ob_mpi


@cython.no_gc_clear               # (as Request)
cdef class Prequest(Request):
    """Handle of a persistent operation.

    Made inactive by a ``*_init`` method (``Send_init``, ``Allreduce_init``,
    ...), started with ``Start`` or ``Prequest.Startall``, completed like any
    ``Request`` (``Wait``, ``Test``, ``Request.Waitall``, ...), and started again
    as often as needed: each start moves what the buffers hold at that moment.
    The buffers stay alive as long as the request. ``Free`` releases it.
    """
    cdef object keep          # the parsed call: the buffers, for the request's life
    cdef object start_fn      # emulation: posts the non-blocking form, returns a Request
    cdef object comm          # the communicator it was made on
    cdef int op               # the operation + 1 (0: not told; see Interceptor.on_start)
    cdef str backend          # the backend it runs on (None: MPI)
    cdef tuple places         # native: its tensors and the memory MPI was given (moved)

    def __cinit__(self, request=None):
        # a copy (Request.__cinit__ ran: see copied) starts what the original
        # starts (set here: Request's __cinit__ runs before these fields exist)
        if isinstance(request, Prequest):
            q = <Prequest>request
            self.keep, self.start_fn, self.comm = q.keep, q.start_fn, q.comm
            self.op, self.backend, self.places = q.op, q.backend, q.places

    def Start(self):
        """Start the operation; the request must be inactive (new or completed).

        Raises
        ------
        ValueError
            If the request or its communicator was freed, or the request is
            still active.
        mcr.Exception
            If MPI reports another error.
        """
        self.start(-1)

    cdef int start(self, Py_ssize_t index) except -1:
        """Start; `index`: the request's position in Startall's list (-1: Start)."""
        cdef int ierr
        cdef bint staged
        if self.comm is not None and (<_MPI.Comm>self.comm).ob_mpi == MPI_COMM_NULL:
            # Open MPI crashes starting a persistent collective on a freed comm
            raise ValueError(f"{request_name(index)}: its communicator was freed; free "
                             "persistent requests before their communicator")
        # the observers and interceptors hear of a start once it is made: a
        # start refused (still active) leaves those of the running one alone
        if self.start_fn is None:
            if self.ob_mpi == MPI_REQUEST_NULL:
                raise ValueError(f"{request_name(index)}: it was freed (or never created)")
            if self.places is not None:
                moved(self.places, index)
            staged = type(self.ob_buf) is _Call and (<_Call>self.ob_buf).staged is not None
            if staged:
                # (MPI would refuse the start only after the copy in had
                # overwritten what the running operation reads)
                if (<_Call>self.ob_buf).live:
                    raise still_active(index)
                restage(<_Call>self.ob_buf)
            with nogil:
                ierr = MPI_Start(&self.ob_mpi)
            if ierr != MPI_SUCCESS:
                if staged:
                    (<_Call>self.ob_buf).live = False
                start_failed(ierr, index)
            if self.obs is not None:
                restart_all(self.obs)
            self.started(None, 0)
            if self.owner is None and self.comm is not None:
                owned_by(self, <Comm>self.comm)
            return 0
        if self.ob_mpi != MPI_REQUEST_NULL or self.ext is not None:
            raise still_active(index)
        if self.obs is not None:
            restart_all(self.obs)
        cdef long long t0 = now_ns()
        cdef Request inner = self.start_fn()
        self.ob_mpi, inner.ob_mpi = inner.ob_mpi, MPI_REQUEST_NULL
        self.ob_buf, inner.ob_buf = inner.ob_buf, None
        self.ext, inner.ext = inner.ext, None
        self.rtype = inner.rtype
        if self.owner is None:
            self.owner, inner.owner = inner.owner, None
            if self.owner is None and self.comm is not None:   # (posted outside Comm.call)
                owned_by(self, <Comm>self.comm)
        self.started(inner, t0)
        if inner.obs is not None:     # what follows the call it posted (the timeout's record)
            self.obs, inner.obs = joined(inner.obs, self.obs), None
        return 0

    cdef int started(self, Request inner, long long t0) except -1:
        """Tell the interceptors of the communicator's chain that this
        request was started (Interceptor.on_start); `inner`: the request the
        start function posted (emulated), at `t0`."""
        if self.comm is None:
            return 0
        cdef tuple chain = (<Comm>self.comm).current_chain()
        if chain is not None:
            for x in chain:
                (<Interceptor>x).on_start(self, inner, t0)
        return 0

    def _note_wire(self, nbytes):
        """The bytes the current start put on the wire (mcr.compress), for
        the logger."""
        note_wire(self, nbytes)

    def __bool__(self):
        # an emulated request between starts holds no MPI handle, yet is alive
        return self.ob_mpi != MPI_REQUEST_NULL or self.start_fn is not None

    @classmethod
    def Startall(cls, requests):
        """Start each of `requests` (a sequence of ``Prequest``, mcr's or
        mpi4py's: those of the communicators mcr leaves to mpi4py), in order.

        Requests that are known not to be startable (freed, or emulated and
        still active) raise ``ValueError`` before any request is started; MPI
        tells that a native one is still active only when it is started, after
        those before it.
        """
        requests = list(requests)
        cdef Prequest req
        for i, r in enumerate(requests):
            if not isinstance(r, Prequest):
                if not isinstance(r, _MPI.Prequest):
                    raise TypeError(f"requests[{i}]: expected an MPI.Prequest, got "
                                    f"{type(r).__name__}")
                if not r:
                    raise ValueError(f"requests[{i}]: it was freed (or never created)")
                continue
            req = <Prequest>r
            if not req:
                raise ValueError(f"requests[{i}]: it was freed (or never created)")
            if req.start_fn is not None and (req.ob_mpi != MPI_REQUEST_NULL or (
                    req.ext is not None)) or staged_running(req):
                raise still_active(i)
            if req.comm is not None and (<_MPI.Comm>req.comm).ob_mpi == MPI_COMM_NULL:
                raise ValueError(f"requests[{i}]: its communicator was freed")
            if req.start_fn is None and req.places is not None:
                moved(req.places, i)
        for i, r in enumerate(requests):
            if isinstance(r, Prequest):
                (<Prequest>r).start(i)
            else:
                _MPI.Prequest.Start(r)

    def Free(self):
        """Release the request; freeing twice is harmless.

        Raises
        ------
        ValueError
            If an emulated request is still active (complete it first).
        """
        if self.start_fn is not None and (self.ob_mpi != MPI_REQUEST_NULL or
                                          self.ext is not None):
            raise ValueError("request: still active; complete it (Wait/Test) before "
                             "freeing it")
        if holds_message(self):
            detach_mpi(self)         # (freed at once if inactive; else once complete)
        elif self.ob_mpi != MPI_REQUEST_NULL:
            CHKERR(MPI_Request_free(&self.ob_mpi))
        self.start_fn = None
        self.ext = None
        self.ob_buf = None


cdef Prequest emulated_prequest(object comm, object start, object keep):
    """A persistent request of `comm` emulated: each Start calls `start()`,
    which posts the non-blocking form and returns its Request; `keep`: what
    the request holds for its life (the parsed call, the buffers)."""
    cdef Prequest preq = Prequest.__new__(Prequest)
    preq.comm, preq.start_fn, preq.keep = comm, start, keep
    return preq


cdef str request_name(Py_ssize_t index):
    return "request" if index < 0 else f"requests[{index}]"


cdef tuple tensor_places(_Call c):
    """The tensors of a call that MPI's persistent request reads or writes
    at each Start, each with the memory MPI was given: (tensor, argument,
    address, bytes); None without tensors."""
    cdef bufinfo b
    places = []
    names = ("buf", "buf") if c.op <= CALL_RECV else ("sendbuf", "recvbuf")
    if _Tensor is None:                 # (torch not imported: no tensor)
        return None
    for own, arg in zip((c.sown, c.rown), names):
        if isinstance(own, _Tensor):
            tensor_info(own, &b, "buffer")
            places.append((own, arg, <Py_ssize_t>b.addr, b.nbytes))
    return tuple(places) if places else None


cdef int moved(tuple places, Py_ssize_t index) except -1:
    """Refuse to start MPI's persistent request when a tensor of it no longer
    holds the memory MPI was given (``set_``, ``resize_``, ``.data =``): MPI
    would read or write the old memory, freed by then."""
    cdef bufinfo b
    for t, arg, addr, nbytes in places:
        tensor_info(t, &b, "buffer")
        if <Py_ssize_t>b.addr != addr or b.nbytes != nbytes:
            raise ValueError(
                f"{request_name(index)}: {arg} no longer holds the memory MPI was given "
                f"when the request was made ({nbytes} bytes at {addr:#x}, now {b.nbytes} at "
                f"{<Py_ssize_t>b.addr:#x}: set_, resize_ or .data =), which MPI would read or "
                "write; make the request again")
    return 0


cdef inline bint staged_running(Prequest req):
    """Whether `req` is native with staged buffers, started and not complete."""
    return type(req.ob_buf) is _Call and (<_Call>req.ob_buf).staged is not None \
        and (<_Call>req.ob_buf).live


cdef object still_active(Py_ssize_t index):
    return ValueError(f"{request_name(index)}: still active; complete it (Wait/Test) "
                      "before starting it again")


cdef int start_failed(int ierr, Py_ssize_t index) except -1:
    """Raise MPI's error from MPI_Start; MPI_ERR_REQUEST on a live persistent
    request means it is still active (MPI keeps no other state to tell)."""
    cdef int eclass = MPI_SUCCESS
    exc = Exception(ierr)
    if MPI_Error_class(ierr, &eclass) == MPI_SUCCESS and eclass == MPI_ERR_REQUEST:
        error = still_active(index)
        if index > 0:
            add_note(error, f"requests[:{index}] were started")
        raise error from exc
    raise exc
