# Isendrecv and Isendrecv_replace made of an Irecv and an Isend, where the MPI
# library lacks them (before MPI-4) or leaves their status unset (MPICH 5.0.2
# returns whatever the status held: source, tag and count are garbage, with
# mpi4py alone too). The Request holds both parts as a _Work: it completes
# when both have, and its status is the receive's.

cdef int isendrecv_native = -1     # whether MPI's own Isendrecv is called; -1: not asked yet


cdef bint compose_isendrecv() except -1:
    """Whether a non-blocking Sendrecv(_replace) is composed here."""
    global isendrecv_native
    if isendrecv_native < 0:
        isendrecv_native = HAVE_ISENDRECV and not library_is_mpich()
    return not isendrecv_native


cdef class _MpiPart:
    """One MPI request of a composed operation as a work handle (see
    progress.pxi); keeps its status once complete."""
    cdef MPI_Request req
    cdef MPI_Status st
    cdef _Call m              # for a receive: its message, to explain a truncation
    cdef str arg             # and the argument naming its buffer

    def __cinit__(self):
        self.req = MPI_REQUEST_NULL

    def is_completed(self):
        cdef int flag = 0, ierr
        if self.req == MPI_REQUEST_NULL:
            return True
        with nogil:
            ierr = MPI_Test(&self.req, &flag, &self.st)
        if ierr != MPI_SUCCESS:
            self.failed(ierr)
        return flag != 0

    def wait(self):
        cdef int ierr
        if self.req == MPI_REQUEST_NULL:
            return
        with nogil:
            ierr = MPI_Wait(&self.req, &self.st)
        if ierr != MPI_SUCCESS:
            self.failed(ierr)

    cdef int failed(self, int ierr) except -1:
        if self.m is None:
            CHKERR(ierr)
        raise_recv_error(ierr, &self.st, &self.m.r, self.arg)
        return -1

    cdef tuple received(self):
        """(source, tag, bytes, element datatype) of the completed receive."""
        cdef int nbytes = 0
        CHKERR(MPI_Get_count(&self.st, MPI_BYTE, &nbytes))
        return (self.st.MPI_SOURCE, self.st.MPI_TAG, nbytes, <Py_ssize_t>self.m.r.dtype)


cdef _Work isendrecv_parts(_Call m, int dest, int sendtag, int source, int recvtag,
                           MPI_Comm comm, bint replace):
    """Post the receive, then the send: of the send side, or for
    Isendrecv_replace of a packed copy of the buffer, made before the
    receive may overwrite it. The _Work that completes with both."""
    cdef _MpiPart r = _MpiPart.__new__(_MpiPart)
    cdef _MpiPart s = _MpiPart.__new__(_MpiPart)
    cdef int size = 0, position = 0, ierr
    cdef bytearray packed = None
    cdef char *p
    r.m = m
    r.arg = "buf" if replace else "recvbuf"
    if replace:
        CHKERR(MPI_Pack_size(m.r.count, m.r.dtype, comm, &size))
        packed = bytearray(size)
        p = packed
        CHKERR(MPI_Pack(m.r.addr, m.r.count, m.r.dtype, p, size, &position, comm))
    if source == MPI_PROC_NULL:          # (MPICH's status of one is wrong too)
        set_status(&r.st, MPI_PROC_NULL, MPI_ANY_TAG, 0)
    else:
        with nogil:
            ierr = MPI_Irecv(m.r.addr, m.r.count, m.r.dtype, source, recvtag, comm, &r.req)
        CHKERR(ierr)
    with nogil:
        if replace:
            ierr = MPI_Isend(p, position, MPI_PACKED, dest, sendtag, comm, &s.req)
        else:
            ierr = MPI_Isend(m.s.addr, m.s.count, m.s.dtype, dest, sendtag, comm, &s.req)
    if ierr != MPI_SUCCESS:
        if r.req != MPI_REQUEST_NULL:
            MPI_Cancel(&r.req)
            MPI_Wait(&r.req, MPI_STATUS_IGNORE)
        CHKERR(ierr)
    cdef _Work w = _Work.__new__(_Work)
    w.backend = "mpi"
    w.works = [r, s]
    w.status_of = r.received
    w.steps = [lambda: unstage(m)] if m.staged is not None else []
    w.keep = (m, packed)
    return w


def _compose_isendrecv(composed):
    """Compose Isendrecv(_replace) from Irecv and Isend (True), call MPI's
    where it has one (False), or as the library calls for (None): the tests
    run the composed path on any MPI."""
    global isendrecv_native
    isendrecv_native = -1 if composed is None else (not composed and HAVE_ISENDRECV)
