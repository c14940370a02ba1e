# Request: completion of non-blocking operations. It keeps the message (and so
# the buffers) alive until the operation completes.

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
