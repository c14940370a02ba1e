# Comm: an mpi4py Intracomm whose buffer methods run on tensors and any buffer.
# Each operation has one `call_*` method that parses and validates the message
# and calls MPI with the GIL released (blocking when `req` is NULL, otherwise
# non-blocking into `req`); the public methods are thin wrappers around it.

cdef object SUM = _mpi4py.SUM
cdef object ANY_SOURCE = _mpi4py.ANY_SOURCE
cdef object ANY_TAG = _mpi4py.ANY_TAG
cdef int TAG_UB = 32767          # read from MPI at import (MPI guarantees >= 32767)
BACKENDS = ("mpi",)


cdef int as_tag(object value, const char *arg, bint allow_any) except? -1:
    """A tag argument as a C int, checked against MPI's TAG_UB."""
    cdef int tag
    try:
        tag = value
    except OverflowError:
        tag = -1000             # out of range
    except TypeError:
        raise TypeError(f"{argstr(arg)}: expected an integer tag, got "
                        f"{type(value).__name__}") from None
    if 0 <= tag <= TAG_UB or (allow_any and tag == MPI_ANY_TAG):
        return tag
    raise ValueError(f"{argstr(arg)}: tag {value} is out of range (valid: 0..{TAG_UB}"
                     f"{', or ANY_TAG' if allow_any else ''})")


cdef inline int as_source(object value, int size) except? -1:
    if value == MPI_ANY_SOURCE:
        return MPI_ANY_SOURCE
    return as_rank(value, size, b"source", True)


cdef int check_backend(object backend) except -1:
    if backend in ("mpi", "auto"):
        return 0
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a string or None, got {type(backend).__name__}")
    raise ValueError(f"backend: unknown backend {backend!r}; available: "
                     f"{', '.join(BACKENDS)}, or 'auto'")


cdef class Comm(_MPI.Intracomm):
    """A communicator whose buffer methods run on torch tensors and any buffer.

    ``mcr.Comm(comm)`` wraps an ``mpi4py.MPI.Intracomm`` (or another
    ``mcr.Comm``) and shares its MPI communicator. A ``mcr.Comm`` *is* an
    ``mpi4py.MPI.Intracomm``: methods mcr does not define (``Dup``, ``Split``,
    ``Free``, ``Compare``, the lowercase pickle-based methods, ...) are mpi4py's
    and return ``mcr.Comm`` objects where they create communicators.

    Every buffer method takes mpi4py's arguments plus a keyword-only
    ``backend`` (``None``, ``"mpi"`` or ``"auto"``: today every call runs on
    MPI). Bad arguments raise ``TypeError``, ``ValueError``, ``IndexError`` or
    ``BufferError`` naming the argument, before any MPI call; MPI errors raise
    ``mcr.Exception``.
    """

    def __repr__(self):
        if self.ob_mpi == MPI_COMM_NULL:
            return "<mcr.Comm null>"
        return f"<mcr.Comm rank {self.Get_rank()} of {self.Get_size()}>"

    def to_mpi4py(self):
        """Return an ``mpi4py.MPI.Intracomm`` sharing this communicator."""
        return _mpi4py.Intracomm(self)

    cdef int prologue(self, object backend) except -1:
        if backend is not None:
            check_backend(backend)
        if self.ob_mpi == MPI_COMM_NULL:
            raise ValueError("comm: the communicator is null (freed, or the result "
                             "of Split with color UNDEFINED)")
        return 0

    cdef int nprocs(self) except -1:
        cdef int size = 0
        CHKERR(MPI_Comm_size(self.ob_mpi, &size))
        return size

    cdef int myrank(self) except -1:
        cdef int rank = 0
        CHKERR(MPI_Comm_rank(self.ob_mpi, &rank))
        return rank

    # -- Point-to-point ------------------------------------------------------

    cdef _Msg call_send(self, object buf, object dest, object tag, object backend,
                        MPI_Request *req):
        self.prologue(backend)
        cdef int idest = as_rank(dest, self.nprocs(), b"dest", True)
        cdef int itag = as_tag(tag, b"tag", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.sown = parse_simple(buf, &m.s, False, b"buf")
        cdef int ierr
        with nogil:
            if req == NULL:
                ierr = MPI_Send(m.s.addr, m.s.count, m.s.dtype, idest, itag, self.ob_mpi)
            else:
                ierr = MPI_Isend(m.s.addr, m.s.count, m.s.dtype, idest, itag, self.ob_mpi,
                                 req)
        CHKERR(ierr)
        return m

    cdef _Msg call_recv(self, object buf, object source, object tag, object status,
                        object backend, MPI_Request *req):
        self.prologue(backend)
        cdef int isource = as_source(source, self.nprocs())
        cdef int itag = as_tag(tag, b"tag", True)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.rown = parse_simple(buf, &m.r, True, b"buf")
        cdef MPI_Status *sp = status_ptr(status)
        cdef int ierr
        with nogil:
            if req == NULL:
                ierr = MPI_Recv(m.r.addr, m.r.count, m.r.dtype, isource, itag, self.ob_mpi,
                                sp)
            else:
                ierr = MPI_Irecv(m.r.addr, m.r.count, m.r.dtype, isource, itag, self.ob_mpi,
                                 req)
        CHKERR(ierr)
        status_type(status, m.r.dtype)
        return m

    def Send(self, buf, dest, tag=0, *, backend=None):
        """Send a message (blocking).

        Parameters
        ----------
        buf : message spec
            A tensor, array or buffer, or ``[buf, count, datatype]`` etc.
        dest : int
            Rank of the receiver, or ``PROC_NULL``.
        tag : int
            Message tag, 0 to ``TAG_UB``.
        """
        self.call_send(buf, dest, tag, backend, NULL)

    def Isend(self, buf, dest, tag=0, *, backend=None):
        """Start sending a message; return a ``Request``. Arguments as ``Send``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_send(buf, dest, tag, backend, &req.ob_mpi)
        return req

    def Recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None, *,
             backend=None):
        """Receive a message (blocking).

        Parameters
        ----------
        buf : message spec
            Where to receive; must be writable and large enough.
        source : int
            Rank of the sender, ``ANY_SOURCE`` or ``PROC_NULL``.
        tag : int
            Message tag or ``ANY_TAG``.
        status : mcr.Status, optional
            Filled with the source, tag and count of the message.
        """
        self.call_recv(buf, source, tag, status, backend, NULL)

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, *, backend=None):
        """Start receiving a message; return a ``Request``. Arguments as ``Recv``."""
        cdef Request req = Request.__new__(Request)
        cdef _Msg m = self.call_recv(buf, source, tag, None, backend, &req.ob_mpi)
        req.ob_buf = m
        req.rtype = m.r.dtype
        return req

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None,
                 source=ANY_SOURCE, recvtag=ANY_TAG, status=None, *,
                 backend=None):
        """Send one message and receive another (blocking).

        Parameters
        ----------
        sendbuf : message spec
            What to send to `dest` with `sendtag`.
        dest : int
            Rank of the receiver, or ``PROC_NULL``.
        sendtag : int
            Tag of the message sent.
        recvbuf : message spec
            Where to receive the message from `source` with `recvtag`.
        source : int
            Rank of the sender, ``ANY_SOURCE`` or ``PROC_NULL``.
        recvtag : int
            Tag of the message received, or ``ANY_TAG``.
        status : mcr.Status, optional
            Filled with the status of the receive.
        """
        self.prologue(backend)
        cdef int idest = as_rank(dest, self.nprocs(), b"dest", True)
        cdef int isource = as_source(source, self.nprocs())
        cdef int isendtag = as_tag(sendtag, b"sendtag", False)
        cdef int irecvtag = as_tag(recvtag, b"recvtag", True)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.sown = parse_simple(sendbuf, &m.s, False, b"sendbuf")
        m.rown = parse_simple(recvbuf, &m.r, True, b"recvbuf")
        check_disjoint(&m.s, &m.r)
        cdef MPI_Status *sp = status_ptr(status)
        cdef int ierr
        with nogil:
            ierr = MPI_Sendrecv(m.s.addr, m.s.count, m.s.dtype, idest, isendtag,
                                m.r.addr, m.r.count, m.r.dtype, isource, irecvtag,
                                self.ob_mpi, sp)
        CHKERR(ierr)
        status_type(status, m.r.dtype)

    # -- Collectives -----------------------------------------------------------

    cdef _Msg call_barrier(self, object backend, MPI_Request *req):
        self.prologue(backend)
        cdef int ierr
        with nogil:
            if req == NULL:
                ierr = MPI_Barrier(self.ob_mpi)
            else:
                ierr = MPI_Ibarrier(self.ob_mpi, req)
        CHKERR(ierr)
        return None

    cdef _Msg call_bcast(self, object buf, object root, object backend, MPI_Request *req):
        self.prologue(backend)
        cdef int size = self.nprocs()
        cdef int iroot = as_rank(root, size, b"root", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_bcast(buf, iroot, self.myrank(), size)
        cdef int ierr
        with nogil:
            if req == NULL:
                ierr = MPI_Bcast(m.r.addr, m.r.count, m.r.dtype, iroot, self.ob_mpi)
            else:
                ierr = MPI_Ibcast(m.r.addr, m.r.count, m.r.dtype, iroot, self.ob_mpi, req)
        CHKERR(ierr)
        return m

    cdef _Msg call_gather(self, object sendbuf, object recvbuf, object root, bint v,
                          object backend, MPI_Request *req):
        self.prologue(backend)
        cdef int size = self.nprocs()
        cdef int iroot = as_rank(root, size, b"root", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_gather(sendbuf, recvbuf, iroot, self.myrank(), size, v)
        cdef int ierr
        with nogil:
            if not v and req == NULL:
                ierr = MPI_Gather(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                  m.r.dtype, iroot, self.ob_mpi)
            elif not v:
                ierr = MPI_Igather(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                   m.r.dtype, iroot, self.ob_mpi, req)
            elif req == NULL:
                ierr = MPI_Gatherv(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.counts,
                                   m.r.displs, m.r.dtype, iroot, self.ob_mpi)
            else:
                ierr = MPI_Igatherv(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.counts,
                                    m.r.displs, m.r.dtype, iroot, self.ob_mpi, req)
        CHKERR(ierr)
        return m

    cdef _Msg call_scatter(self, object sendbuf, object recvbuf, object root, bint v,
                           object backend, MPI_Request *req):
        self.prologue(backend)
        cdef int size = self.nprocs()
        cdef int iroot = as_rank(root, size, b"root", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_scatter(sendbuf, recvbuf, iroot, self.myrank(), size, v)
        cdef int ierr
        with nogil:
            if not v and req == NULL:
                ierr = MPI_Scatter(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                   m.r.dtype, iroot, self.ob_mpi)
            elif not v:
                ierr = MPI_Iscatter(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                    m.r.dtype, iroot, self.ob_mpi, req)
            elif req == NULL:
                ierr = MPI_Scatterv(m.s.addr, m.s.counts, m.s.displs, m.s.dtype, m.r.addr,
                                    m.r.count, m.r.dtype, iroot, self.ob_mpi)
            else:
                ierr = MPI_Iscatterv(m.s.addr, m.s.counts, m.s.displs, m.s.dtype, m.r.addr,
                                     m.r.count, m.r.dtype, iroot, self.ob_mpi, req)
        CHKERR(ierr)
        return m

    cdef _Msg call_allgather(self, object sendbuf, object recvbuf, bint v, object backend,
                             MPI_Request *req):
        self.prologue(backend)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_allgather(sendbuf, recvbuf, self.myrank(), self.nprocs(), v)
        cdef int ierr
        with nogil:
            if not v and req == NULL:
                ierr = MPI_Allgather(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                     m.r.dtype, self.ob_mpi)
            elif not v:
                ierr = MPI_Iallgather(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                      m.r.dtype, self.ob_mpi, req)
            elif req == NULL:
                ierr = MPI_Allgatherv(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.counts,
                                      m.r.displs, m.r.dtype, self.ob_mpi)
            else:
                ierr = MPI_Iallgatherv(m.s.addr, m.s.count, m.s.dtype, m.r.addr,
                                       m.r.counts, m.r.displs, m.r.dtype, self.ob_mpi, req)
        CHKERR(ierr)
        return m

    cdef _Msg call_alltoall(self, object sendbuf, object recvbuf, bint v, object backend,
                            MPI_Request *req):
        self.prologue(backend)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_alltoall(sendbuf, recvbuf, self.nprocs(), v)
        cdef int ierr
        with nogil:
            if not v and req == NULL:
                ierr = MPI_Alltoall(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                    m.r.dtype, self.ob_mpi)
            elif not v:
                ierr = MPI_Ialltoall(m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                     m.r.dtype, self.ob_mpi, req)
            elif req == NULL:
                ierr = MPI_Alltoallv(m.s.addr, m.s.counts, m.s.displs, m.s.dtype, m.r.addr,
                                     m.r.counts, m.r.displs, m.r.dtype, self.ob_mpi)
            else:
                ierr = MPI_Ialltoallv(m.s.addr, m.s.counts, m.s.displs, m.s.dtype,
                                      m.r.addr, m.r.counts, m.r.displs, m.r.dtype,
                                      self.ob_mpi, req)
        CHKERR(ierr)
        return m

    cdef _Msg call_reduce(self, object sendbuf, object recvbuf, object op, object root,
                          object backend, MPI_Request *req):
        self.prologue(backend)
        cdef int size = self.nprocs()
        cdef int iroot = as_rank(root, size, b"root", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_reduce(sendbuf, recvbuf, iroot, self.myrank(), size)
        cdef MPI_Op mop
        cdef int count = m.s.count if m.s.addr != <char*>MPI_IN_PLACE else m.r.count
        cdef MPI_Datatype dtype = m.s.dtype if m.s.addr != <char*>MPI_IN_PLACE else m.r.dtype
        resolve_op(op, m.s.tindex if m.s.addr != <char*>MPI_IN_PLACE else m.r.tindex, &mop)
        cdef int ierr
        with nogil:
            if req == NULL:
                ierr = MPI_Reduce(m.s.addr, m.r.addr, count, dtype, mop, iroot, self.ob_mpi)
            else:
                ierr = MPI_Ireduce(m.s.addr, m.r.addr, count, dtype, mop, iroot,
                                   self.ob_mpi, req)
        CHKERR(ierr)
        return m

    cdef _Msg call_allreduce(self, object sendbuf, object recvbuf, object op, int kind,
                             object backend, MPI_Request *req):
        # kind: 0 Allreduce, 1 Scan, 2 Exscan (same message shape)
        self.prologue(backend)
        cdef _Msg m = _Msg.__new__(_Msg)
        cdef MPI_Op mop
        m.for_allreduce(sendbuf, recvbuf)
        resolve_op(op, m.r.tindex, &mop)
        cdef int ierr
        with nogil:
            if kind == 0 and req == NULL:
                ierr = MPI_Allreduce(m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop,
                                     self.ob_mpi)
            elif kind == 0:
                ierr = MPI_Iallreduce(m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop,
                                      self.ob_mpi, req)
            elif kind == 1 and req == NULL:
                ierr = MPI_Scan(m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop, self.ob_mpi)
            elif kind == 1:
                ierr = MPI_Iscan(m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop,
                                 self.ob_mpi, req)
            elif req == NULL:
                ierr = MPI_Exscan(m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop,
                                  self.ob_mpi)
            else:
                ierr = MPI_Iexscan(m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop,
                                   self.ob_mpi, req)
        CHKERR(ierr)
        return m

    cdef _Msg call_reduce_scatter(self, object sendbuf, object recvbuf, object recvcounts,
                                  object op, bint block, object backend, MPI_Request *req):
        self.prologue(backend)
        cdef _Msg m = _Msg.__new__(_Msg)
        cdef MPI_Op mop
        if block:
            m.for_reduce_scatter_block(sendbuf, recvbuf, self.nprocs())
        else:
            m.for_reduce_scatter(sendbuf, recvbuf, recvcounts, self.myrank(), self.nprocs())
        resolve_op(op, m.r.tindex, &mop)
        cdef int ierr
        with nogil:
            if block and req == NULL:
                ierr = MPI_Reduce_scatter_block(m.s.addr, m.r.addr, m.r.count, m.r.dtype,
                                                mop, self.ob_mpi)
            elif block:
                ierr = MPI_Ireduce_scatter_block(m.s.addr, m.r.addr, m.r.count, m.r.dtype,
                                                 mop, self.ob_mpi, req)
            elif req == NULL:
                ierr = MPI_Reduce_scatter(m.s.addr, m.r.addr, m.r.counts, m.r.dtype, mop,
                                          self.ob_mpi)
            else:
                ierr = MPI_Ireduce_scatter(m.s.addr, m.r.addr, m.r.counts, m.r.dtype, mop,
                                           self.ob_mpi, req)
        CHKERR(ierr)
        return m

    def Barrier(self, *, backend=None):
        """Block until every process of the communicator has called it."""
        self.call_barrier(backend, NULL)

    def Ibarrier(self, *, backend=None):
        """Start a barrier; return a ``Request``."""
        cdef Request req = Request.__new__(Request)
        self.call_barrier(backend, &req.ob_mpi)
        return req

    def Bcast(self, buf, root=0, *, backend=None):
        """Broadcast `buf` from `root` to all processes.

        Parameters
        ----------
        buf : message spec
            Sent at `root`, received (must be writable) elsewhere.
        root : int
            Rank of the sending process.
        """
        self.call_bcast(buf, root, backend, NULL)

    def Ibcast(self, buf, root=0, *, backend=None):
        """Start a broadcast; return a ``Request``. Arguments as ``Bcast``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_bcast(buf, root, backend, &req.ob_mpi)
        return req

    def Gather(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Gather equal blocks from all processes at `root`.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's block; ``IN_PLACE`` at the root (its block is already
            in place in `recvbuf`).
        recvbuf : message spec or None
            At the root, room for one block per process, in rank order; ignored
            elsewhere.
        root : int
            Rank of the gathering process.
        """
        self.call_gather(sendbuf, recvbuf, root, False, backend, NULL)

    def Igather(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Start a gather; return a ``Request``. Arguments as ``Gather``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_gather(sendbuf, recvbuf, root, False, backend, &req.ob_mpi)
        return req

    def Gatherv(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Gather blocks of varying size at `root`.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's block (``IN_PLACE`` at the root).
        recvbuf : vector message spec or None
            At the root ``[buf, counts, displs]`` (or another vector form):
            block ``i`` of ``counts[i]`` elements lands at ``displs[i]``.
        root : int
            Rank of the gathering process.
        """
        self.call_gather(sendbuf, recvbuf, root, True, backend, NULL)

    def Igatherv(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Start a vector gather; return a ``Request``. Arguments as ``Gatherv``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_gather(sendbuf, recvbuf, root, True, backend, &req.ob_mpi)
        return req

    def Scatter(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Scatter equal blocks of `sendbuf` from `root` to all processes.

        Parameters
        ----------
        sendbuf : message spec or None
            At the root, one block per process in rank order; ignored elsewhere.
        recvbuf : message spec or IN_PLACE
            This process's block (``IN_PLACE`` at the root).
        root : int
            Rank of the scattering process.
        """
        self.call_scatter(sendbuf, recvbuf, root, False, backend, NULL)

    def Iscatter(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Start a scatter; return a ``Request``. Arguments as ``Scatter``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_scatter(sendbuf, recvbuf, root, False, backend, &req.ob_mpi)
        return req

    def Scatterv(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Scatter blocks of varying size from `root`.

        Parameters
        ----------
        sendbuf : vector message spec or None
            At the root ``[buf, counts, displs]``: process ``i`` gets
            ``counts[i]`` elements from ``displs[i]``.
        recvbuf : message spec or IN_PLACE
            This process's block (``IN_PLACE`` at the root).
        root : int
            Rank of the scattering process.
        """
        self.call_scatter(sendbuf, recvbuf, root, True, backend, NULL)

    def Iscatterv(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Start a vector scatter; return a ``Request``. Arguments as ``Scatterv``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_scatter(sendbuf, recvbuf, root, True, backend, &req.ob_mpi)
        return req

    def Allgather(self, sendbuf, recvbuf, *, backend=None):
        """Gather equal blocks from all processes on all processes.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's block (``IN_PLACE``: already at its place in `recvbuf`).
        recvbuf : message spec
            Room for one block per process, in rank order.
        """
        self.call_allgather(sendbuf, recvbuf, False, backend, NULL)

    def Iallgather(self, sendbuf, recvbuf, *, backend=None):
        """Start an allgather; return a ``Request``. Arguments as ``Allgather``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allgather(sendbuf, recvbuf, False, backend, &req.ob_mpi)
        return req

    def Allgatherv(self, sendbuf, recvbuf, *, backend=None):
        """Gather blocks of varying size on all processes.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's block.
        recvbuf : vector message spec
            ``[buf, counts, displs]``: block ``i`` lands at ``displs[i]``.
        """
        self.call_allgather(sendbuf, recvbuf, True, backend, NULL)

    def Iallgatherv(self, sendbuf, recvbuf, *, backend=None):
        """Start a vector allgather; return a ``Request``. Arguments as ``Allgatherv``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allgather(sendbuf, recvbuf, True, backend, &req.ob_mpi)
        return req

    def Alltoall(self, sendbuf, recvbuf, *, backend=None):
        """Send block ``j`` of `sendbuf` to process ``j``, from every process.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            One equal block per destination (``IN_PLACE``: taken from `recvbuf`).
        recvbuf : message spec
            One equal block per source, in rank order.
        """
        self.call_alltoall(sendbuf, recvbuf, False, backend, NULL)

    def Ialltoall(self, sendbuf, recvbuf, *, backend=None):
        """Start an all-to-all; return a ``Request``. Arguments as ``Alltoall``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_alltoall(sendbuf, recvbuf, False, backend, &req.ob_mpi)
        return req

    def Alltoallv(self, sendbuf, recvbuf, *, backend=None):
        """All-to-all with blocks of varying size.

        Parameters
        ----------
        sendbuf : vector message spec or IN_PLACE
            ``[buf, counts, displs]``: ``counts[j]`` elements from ``displs[j]``
            go to process ``j``.
        recvbuf : vector message spec
            ``[buf, counts, displs]``: ``counts[i]`` elements from process ``i``
            land at ``displs[i]``.
        """
        self.call_alltoall(sendbuf, recvbuf, True, backend, NULL)

    def Ialltoallv(self, sendbuf, recvbuf, *, backend=None):
        """Start a vector all-to-all; return a ``Request``. Arguments as ``Alltoallv``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_alltoall(sendbuf, recvbuf, True, backend, &req.ob_mpi)
        return req

    def Reduce(self, sendbuf, recvbuf, op=SUM, root=0, *, backend=None):
        """Reduce element-wise over all processes, result at `root`.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's operand (``IN_PLACE`` at the root: taken from `recvbuf`).
        recvbuf : message spec or None
            At the root, receives the result; ignored elsewhere.
        op : mpi4py.MPI.Op
            ``SUM``, ``PROD``, ``MAX``, ``MIN``, ``LAND``, ``LOR``, ``LXOR``,
            ``BAND``, ``BOR``, ``BXOR`` (where they apply to the element type) or
            a user-defined op.
        root : int
            Rank that receives the result.
        """
        self.call_reduce(sendbuf, recvbuf, op, root, backend, NULL)

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root=0, *, backend=None):
        """Start a reduce; return a ``Request``. Arguments as ``Reduce``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_reduce(sendbuf, recvbuf, op, root, backend, &req.ob_mpi)
        return req

    def Allreduce(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Reduce element-wise over all processes, result on all.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's operand (``IN_PLACE``: taken from `recvbuf`).
        recvbuf : message spec
            Receives the result; same element type and count as `sendbuf`.
        op : mpi4py.MPI.Op
            The reduction, as in ``Reduce``.
        """
        self.call_allreduce(sendbuf, recvbuf, op, 0, backend, NULL)

    def Iallreduce(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start an allreduce; return a ``Request``. Arguments as ``Allreduce``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allreduce(sendbuf, recvbuf, op, 0, backend, &req.ob_mpi)
        return req

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Reduce element-wise, then scatter equal blocks of the result.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            ``size`` blocks of ``count(recvbuf)`` elements (``IN_PLACE``: the
            input is the whole of `recvbuf`, the result its first block).
        recvbuf : message spec
            Receives this process's block of the result.
        op : mpi4py.MPI.Op
            The reduction, as in ``Reduce``.
        """
        self.call_reduce_scatter(sendbuf, recvbuf, None, op, True, backend, NULL)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start a reduce-scatter-block; return a ``Request``. Arguments as
        ``Reduce_scatter_block``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_reduce_scatter(sendbuf, recvbuf, None, op, True, backend,
                                              &req.ob_mpi)
        return req

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM, *, backend=None):
        """Reduce element-wise, then scatter blocks of varying size.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            ``sum(recvcounts)`` elements (``IN_PLACE``: the input is `recvbuf`,
            the result its first ``recvcounts[rank]`` elements).
        recvbuf : message spec
            Receives ``recvcounts[rank]`` elements of the result.
        recvcounts : sequence of int, optional
            Block sizes, one per process; by default equal blocks.
        op : mpi4py.MPI.Op
            The reduction, as in ``Reduce``.
        """
        self.call_reduce_scatter(sendbuf, recvbuf, recvcounts, op, False, backend, NULL)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM, *, backend=None):
        """Start a reduce-scatter; return a ``Request``. Arguments as ``Reduce_scatter``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_reduce_scatter(sendbuf, recvbuf, recvcounts, op, False,
                                              backend, &req.ob_mpi)
        return req

    def Scan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Inclusive prefix reduction: rank ``i`` gets the reduction of ranks 0..i.

        Arguments as ``Allreduce``.
        """
        self.call_allreduce(sendbuf, recvbuf, op, 1, backend, NULL)

    def Iscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start an inclusive scan; return a ``Request``. Arguments as ``Scan``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allreduce(sendbuf, recvbuf, op, 1, backend, &req.ob_mpi)
        return req

    def Exscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Exclusive prefix reduction: rank ``i`` gets the reduction of ranks
        0..i-1; `recvbuf` at rank 0 is left undefined (as in MPI).

        Arguments as ``Allreduce``.
        """
        self.call_allreduce(sendbuf, recvbuf, op, 2, backend, NULL)

    def Iexscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start an exclusive scan; return a ``Request``. Arguments as ``Exscan``."""
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allreduce(sendbuf, recvbuf, op, 2, backend, &req.ob_mpi)
        return req

    # -- Communicator management -------------------------------------------------

    def Split(self, int color=0, int key=0):
        """Split into disjoint communicators by `color`, ordered by `key`.

        Returns an ``mcr.Comm``; with ``color=UNDEFINED`` a null one (as
        mpi4py's ``COMM_NULL``), on which every operation raises ``ValueError``.
        """
        return as_comm(_MPI.Intracomm.Split(self, color, key))

    def Split_type(self, int split_type, int key=0, info=None):
        """Split by a type such as ``COMM_TYPE_SHARED`` (processes sharing memory),
        ordered by `key`; returns an ``mcr.Comm`` (null for ``UNDEFINED``)."""
        if info is None:
            return as_comm(_MPI.Intracomm.Split_type(self, split_type, key))
        return as_comm(_MPI.Intracomm.Split_type(self, split_type, key, info))

    def Create(self, group):
        """Create a communicator from a group (collective); see mpi4py."""
        return as_comm(_MPI.Intracomm.Create(self, group))

    def Create_group(self, group, int tag=0):
        """Create a communicator from a group (collective over the group); see mpi4py."""
        return as_comm(_MPI.Intracomm.Create_group(self, group, tag))


cdef Comm as_comm(_MPI.Comm comm):
    cdef Comm out = Comm.__new__(Comm)
    out.ob_mpi = comm.ob_mpi
    return out
