# Request: completion of non-blocking operations. It keeps the message (and so
# the buffers) alive until the operation completes.

from functools import partial

cdef class Request(_MPI.Request):
    """Handle of a non-blocking operation.

    An ``mpi4py.MPI.Request``: the buffers of the operation stay alive and must
    not be touched until ``Wait``/``Test`` (or a class method such as
    ``Waitall``) reports completion.
    """
    cdef MPI_Datatype rtype      # element type of a receive, for Status.Get_count

    def __cinit__(self, *args, **kwargs):
        self.rtype = MPI_DATATYPE_NULL

    cdef inline int complete(self, object status) except -1:
        if self.ob_mpi == MPI_REQUEST_NULL:
            self.ob_buf = None
            status_type(status, self.rtype)
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
        cdef int ierr
        with nogil:
            ierr = MPI_Wait(&self.ob_mpi, sp)
        CHKERR(ierr)
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
        cdef int flag = 0
        CHKERR(MPI_Test(&self.ob_mpi, &flag, sp))
        if flag:
            self.complete(status)
        return bool(flag)

    @classmethod
    def Waitall(cls, requests, statuses=None):
        """Wait for all requests to complete.

        Parameters
        ----------
        requests : sequence of Request
            The requests (inactive and null requests are allowed).
        statuses : list, optional
            Filled (and extended if shorter) with one ``mcr.Status`` per request.

        Returns
        -------
        True
        """
        return complete_all(requests, statuses, True)

    @classmethod
    def Testall(cls, requests, statuses=None):
        """Test whether all requests have completed, without blocking.

        Parameters
        ----------
        requests : sequence of Request
        statuses : list, optional
            Filled as in ``Waitall`` when all have completed.

        Returns
        -------
        bool
            True when every request has completed.
        """
        return complete_all(requests, statuses, False)


cdef object complete_all(object requests, object statuses, bint wait):
    requests = list(requests)
    cdef Py_ssize_t i, n = len(requests)
    for i in range(n):
        if not isinstance(requests[i], _MPI.Request):
            raise TypeError(f"requests[{i}]: expected an MPI.Request, got "
                            f"{type(requests[i]).__name__}")
    cdef MPI_Request *handles = <MPI_Request*>PyMem_Malloc(max(n, 1) * sizeof(MPI_Request))
    cdef MPI_Status *sts = <MPI_Status*>PyMem_Malloc(max(n, 1) * sizeof(MPI_Status))
    cdef int flag = 1, ierr = MPI_SUCCESS
    try:
        if handles == NULL or sts == NULL:
            raise MemoryError
        for i in range(n):
            handles[i] = (<_MPI.Request>requests[i]).ob_mpi
        if wait:
            with nogil:
                ierr = MPI_Waitall(<int>n, handles, sts)
        else:
            ierr = MPI_Testall(<int>n, handles, &flag, sts)
        for i in range(n):
            (<_MPI.Request>requests[i]).ob_mpi = handles[i]
        CHKERR(ierr)
        if not flag:
            return False
        for i in range(n):
            req = requests[i]
            if (<_MPI.Request>req).ob_mpi == MPI_REQUEST_NULL:
                (<_MPI.Request>req).ob_buf = None
        if statuses is not None:
            while len(statuses) < n:
                statuses.append(Status())
            for i in range(n):
                status = statuses[i]
                (<_MPI.Status>status).ob_mpi = sts[i]
                if isinstance(requests[i], Request):
                    status_type(status, (<Request>requests[i]).rtype)
        return True
    finally:
        PyMem_Free(handles)
        PyMem_Free(sts)


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


cdef class Prequest(Request):
    """Handle of a persistent operation.

    Made inactive by a ``*_init`` method (``Send_init``, ``Allreduce_init``,
    ...), started with ``Start`` or ``Prequest.Startall``, completed like any
    ``Request`` (``Wait``, ``Test``, ``Request.Waitall``, ...), and started again
    as often as needed: each start moves what the buffers hold at that moment.
    The buffers stay alive as long as the request. ``Free`` releases it.
    """
    cdef object keep          # the parsed message: the buffers, for the request's life
    cdef object start_fn      # emulation: posts the non-blocking form, returns a Request

    cdef int form(self) noexcept:
        return VALIDATE if emulate_persistent else PERSISTENT

    cdef int emulate(self, object nonblocking, tuple args, object backend) except -1:
        if emulate_persistent:
            self.start_fn = partial(nonblocking, *args, backend=backend)
        return 0

    def Start(self):
        """Start the operation; the request must be inactive (new or completed).

        Raises
        ------
        ValueError
            If the request was freed or (emulated) is still active.
        mcr.Exception
            If MPI reports an error (e.g. starting an active request).
        """
        cdef int ierr
        if self.start_fn is None:
            if self.ob_mpi == MPI_REQUEST_NULL:
                raise ValueError("request: it was freed (or never created)")
            with nogil:
                ierr = MPI_Start(&self.ob_mpi)
            CHKERR(ierr)
            return None
        if self.ob_mpi != MPI_REQUEST_NULL:
            raise ValueError("request: still active; complete it (Wait/Test) before "
                             "starting it again")
        cdef Request inner = self.start_fn()
        self.ob_mpi, inner.ob_mpi = inner.ob_mpi, MPI_REQUEST_NULL
        self.ob_buf, inner.ob_buf = inner.ob_buf, None
        self.rtype = inner.rtype
        return None

    @classmethod
    def Startall(cls, requests):
        """Start each of `requests` (a sequence of ``Prequest``), in order."""
        requests = list(requests)
        for i, req in enumerate(requests):
            if not isinstance(req, Prequest):
                raise TypeError(f"requests[{i}]: expected an mcr.Prequest, got "
                                f"{type(req).__name__}")
        for req in requests:
            req.Start()

    def Free(self):
        """Release the request (it should be inactive); freeing twice is harmless."""
        if self.ob_mpi != MPI_REQUEST_NULL:
            CHKERR(MPI_Request_free(&self.ob_mpi))
        self.start_fn = None
