# Comm: an mpi4py Intracomm whose buffer methods run on tensors and any buffer.
# Each operation has one `call_*` method that parses and validates the message
# and calls MPI with the GIL released, in the form `mode` asks for (blocking,
# non-blocking or persistent into `req`; include/mcr/dispatch.h); the public
# methods are thin wrappers around it.

cdef object SUM = _mpi4py.SUM
cdef object ANY_SOURCE = _mpi4py.ANY_SOURCE
cdef object ANY_TAG = _mpi4py.ANY_TAG
cdef int TAG_UB = 32767          # MPI guarantees >= 32767; MPI's value is read lazily
cdef bint tag_ub_read = False


cdef int read_tag_ub() except -1:
    """Read MPI's TAG_UB, at the first tag above 32767 (not at import, where
    MPI may not be initialized yet)."""
    global TAG_UB, tag_ub_read
    cdef int *value = NULL
    cdef int flag = 0
    CHKERR(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag))
    if flag and value != NULL:
        TAG_UB = value[0]
    tag_ub_read = True
    return 0


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
    if not tag_ub_read:           # the error message gives MPI's own bound
        read_tag_ub()
        if 0 <= tag <= TAG_UB:
            return tag
    raise ValueError(f"{argstr(arg)}: tag {value} is out of range (valid: 0..{TAG_UB}"
                     f"{', or ANY_TAG' if allow_any else ''})")


cdef inline int as_source(object value, int size) except? -1:
    if value == MPI_ANY_SOURCE:
        return MPI_ANY_SOURCE
    return as_rank(value, size, b"source", True)


# the compose.py operation of each send mode (dispatch.h's MCR_STANDARD ...)
cdef tuple SEND_MODE_NAMES = ("Isend", "Ibsend", "Issend", "Irsend")


cdef int check_isendrecv(int mode, const char *name) except -1:
    if mode != VALIDATE and not HAVE_ISENDRECV:
        raise NotImplementedError(f"{name.decode()}: the MPI library lacks it (MPI-4); "
                                  f"use Isend and Irecv")
    return 0


cdef int check_backend(object backend) except -1:
    if backend == "mpi" or backend == "auto":
        return 0
    backends_module().check_name(backend)
    return 0


cdef object default_backend():
    """The backend new communicators use: $MCR_BACKEND, else MPI (None)."""
    import os
    name = os.environ.get("MCR_BACKEND") or None
    if name is not None:
        try:
            check_backend(name)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"MCR_BACKEND: {exc}") from None
    return None if name == "mpi" else name


cdef class Comm(_MPI.Intracomm):
    """A communicator whose buffer methods run on torch tensors and any buffer.

    ``mcr.Comm(comm)`` wraps an ``mpi4py.MPI.Intracomm`` (or another
    ``mcr.Comm``) and shares its MPI communicator. A ``mcr.Comm`` *is* an
    ``mpi4py.MPI.Intracomm``: methods mcr does not define (``Dup``,
    ``Compare``, the lowercase pickle-based methods, ...) are mpi4py's, and
    those that create communicators return ``mcr.Comm`` objects.

    Every buffer method takes mpi4py's arguments plus a keyword-only
    ``backend``: ``"mpi"``, ``"gloo"``, ``"nccl"`` (CUDA tensors), ``"auto"``,
    or ``None`` for the communicator's default (the ``backend`` attribute,
    initially ``$MCR_BACKEND`` or ``"mpi"``). Bad arguments raise
    ``TypeError``, ``ValueError``, ``IndexError`` or ``BufferError`` naming the
    argument, before any communication; MPI errors raise ``mcr.Exception``.
    """
    cdef object dflt              # default backend name; None means MPI

    def __cinit__(self, *args, **kwargs):
        self.dflt = ENV_BACKEND

    @property
    def backend(self):
        """The backend used when a call passes ``backend=None`` (``"mpi"``,
        ``"gloo"``, ``"nccl"`` or ``"auto"``); settable. Communicators made
        from this one (``Dup``, ``Split``, ...) start with the same."""
        return "mpi" if self.dflt is None else self.dflt

    @backend.setter
    def backend(self, value):
        if value is None:
            value = "mpi"
        check_backend(value)
        self.dflt = None if value == "mpi" else value

    def __repr__(self):
        if self.ob_mpi == MPI_COMM_NULL:
            return "<mcr.Comm null>"
        return f"<mcr.Comm rank {self.Get_rank()} of {self.Get_size()}>"

    def to_mpi4py(self):
        """Return an ``mpi4py.MPI.Intracomm`` sharing this communicator."""
        return _mpi4py.Intracomm(self)

    cdef inline object sub(self, object backend):
        """The sub-communicator of a backend other than MPI to run on, or None
        for MPI (the fast path: two pointer tests when nothing is chosen)."""
        if backend is None:
            backend = self.dflt
            if backend is None:
                return None
        if backend == "mpi" or backend == "auto":
            return None
        backends_module().check_name(backend)
        if self.ob_mpi == MPI_COMM_NULL:
            self.prologue(None)           # the null-communicator error
        return backends_module().subcomm(self, backend)

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

    cdef _Msg call_send(self, object buf, object dest, object tag, object backend, int mode,
                        MPI_Request *req, int send_mode=STANDARD):
        self.prologue(backend)
        cdef int idest = as_rank(dest, self.nprocs(), b"dest", True)
        cdef int itag = as_tag(tag, b"tag", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.sown = parse_simple(buf, &m.s, False, b"buf")
        if needs_staging(m):
            stage(m, mode, 1, 1)
        cdef int ierr
        with nogil:
            ierr = mcr_send_in(send_mode, mode, m.s.addr, m.s.count, m.s.dtype, idest, itag,
                               self.ob_mpi, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    cdef _Msg call_recv(self, object buf, object source, object tag, object status,
                        object backend, int mode, MPI_Request *req):
        self.prologue(backend)
        cdef int isource = as_source(source, self.nprocs())
        cdef int itag = as_tag(tag, b"tag", True)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.rown = parse_simple(buf, &m.r, True, b"buf")
        cdef MPI_Status *sp = status_ptr(status)
        cdef MPI_Status own
        if sp == MPI_STATUS_IGNORE:
            sp = &own                 # it explains a truncation
        if needs_staging(m):
            stage(m, mode, 1, 1)
        cdef int ierr
        with nogil:
            ierr = mcr_recv(mode, m.r.addr, m.r.count, m.r.dtype, isource, itag, self.ob_mpi,
                            sp, req)
        if ierr != MPI_SUCCESS:
            raise_recv_error(ierr, sp, &m.r, "buf")
        finish_call(m, mode)
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
        sub = self.sub(backend)
        if sub is not None:
            sub.run("Isend", self.call_send(buf, dest, tag, None, VALIDATE, NULL),
                    dest=dest, tag=tag).Wait()
            return
        self.call_send(buf, dest, tag, backend, BLOCKING, NULL)

    def Isend(self, buf, dest, tag=0, *, backend=None):
        """Start sending a message; return a ``Request``. Arguments as ``Send``."""
        sub = self.sub(backend)
        if sub is not None:
            return sub.run("Isend", self.call_send(buf, dest, tag, None, VALIDATE, NULL),
                           dest=dest, tag=tag)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_send(buf, dest, tag, backend, NONBLOCKING, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            check_status(status)          # before the receive takes the message
            m = self.call_recv(buf, source, tag, None, None, VALIDATE, NULL)
            sub.run("Irecv", m, source=source, tag=tag).Wait(status)
            return
        self.call_recv(buf, source, tag, status, backend, BLOCKING, NULL)

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, *, backend=None):
        """Start receiving a message; return a ``Request``. Arguments as ``Recv``."""
        sub = self.sub(backend)
        if sub is not None:
            return sub.run("Irecv", self.call_recv(buf, source, tag, None, None, VALIDATE,
                                                   NULL), source=source, tag=tag)
        cdef Request req = Request.__new__(Request)
        cdef _Msg m = self.call_recv(buf, source, tag, None,
                                     backend, NONBLOCKING, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            check_status(status)
            sreq = self.Isend(sendbuf, dest, sendtag, backend=backend)
            self.Recv(recvbuf, source, recvtag, status, backend=backend)
            sreq.Wait()
            return
        self.prologue(backend)
        cdef int idest = as_rank(dest, self.nprocs(), b"dest", True)
        cdef int isource = as_source(source, self.nprocs())
        cdef int isendtag = as_tag(sendtag, b"sendtag", False)
        cdef int irecvtag = as_tag(recvtag, b"recvtag", True)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.sown = parse_simple(sendbuf, &m.s, False, b"sendbuf")
        m.rown = parse_simple(recvbuf, &m.r, True, b"recvbuf")
        check_disjoint(&m.s, &m.r)
        if needs_staging(m):
            stage(m, BLOCKING, 1, 1)
        cdef MPI_Status *sp = status_ptr(status)
        cdef MPI_Status own
        if sp == MPI_STATUS_IGNORE:
            sp = &own
        cdef int ierr
        with nogil:
            ierr = MPI_Sendrecv(m.s.addr, m.s.count, m.s.dtype, idest, isendtag,
                                m.r.addr, m.r.count, m.r.dtype, isource, irecvtag,
                                self.ob_mpi, sp)
        if ierr != MPI_SUCCESS:
            raise_recv_error(ierr, sp, &m.r, "recvbuf")
        finish_call(m, BLOCKING)
        status_type(status, m.r.dtype)

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG,
                         status=None, *, backend=None):
        """Send `buf` and receive into it, replacing its contents (blocking).

        Parameters
        ----------
        buf : message spec
            Sent to `dest`, then overwritten by the message from `source`;
            must be writable.
        dest, sendtag, source, recvtag, status
            As in ``Sendrecv``.
        """
        sub = self.sub(backend)
        if sub is not None:
            check_status(status)
            self.call_send(buf, dest, sendtag, None, VALIDATE, NULL)
            sub.run("Sendrecv_replace",
                    self.call_recv(buf, source, recvtag, None, None, VALIDATE, NULL),
                    dest=dest, sendtag=sendtag, source=source, tag=recvtag).Wait(status)
            return
        self.prologue(backend)
        cdef int idest = as_rank(dest, self.nprocs(), b"dest", True)
        cdef int isource = as_source(source, self.nprocs())
        cdef int isendtag = as_tag(sendtag, b"sendtag", False)
        cdef int irecvtag = as_tag(recvtag, b"recvtag", True)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.rown = parse_simple(buf, &m.r, True, b"buf")
        if needs_staging(m):
            stage(m, BLOCKING, 1, 1)
        cdef MPI_Status *sp = status_ptr(status)
        cdef MPI_Status own
        if sp == MPI_STATUS_IGNORE:
            sp = &own
        cdef int ierr
        with nogil:
            ierr = MPI_Sendrecv_replace(m.r.addr, m.r.count, m.r.dtype, idest, isendtag,
                                        isource, irecvtag, self.ob_mpi, sp)
        if ierr != MPI_SUCCESS:
            raise_recv_error(ierr, sp, &m.r, "buf")
        finish_call(m, BLOCKING)
        status_type(status, m.r.dtype)

    def Probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None, *, backend=None):
        """Wait until a message from `source` with `tag` can be received.

        Parameters
        ----------
        source : int
            Rank of the sender, ``ANY_SOURCE`` or ``PROC_NULL``.
        tag : int
            Message tag or ``ANY_TAG``.
        status : mcr.Status, optional
            Filled with the source, tag and size of the message
            (``Get_count(datatype)`` to count elements of a type).

        Returns
        -------
        True
        """
        sub = self.sub(backend)
        if sub is not None:
            check_status(status)
            return sub.probe(as_source(source, self.nprocs()), as_tag(tag, b"tag", True),
                             status, True)
        self.prologue(backend)
        cdef int isource = as_source(source, self.nprocs())
        cdef int itag = as_tag(tag, b"tag", True)
        cdef MPI_Status *sp = status_ptr(status)
        cdef int ierr
        with nogil:
            ierr = MPI_Probe(isource, itag, self.ob_mpi, sp)
        CHKERR(ierr)
        status_type(status, MPI_DATATYPE_NULL)     # no receive yet: counts in bytes
        return True

    def Iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None, *, backend=None):
        """Whether a message from `source` with `tag` can be received now.

        Arguments as ``Probe``; `status` is filled only when it returns True.

        Returns
        -------
        bool
        """
        sub = self.sub(backend)
        if sub is not None:
            check_status(status)
            return sub.probe(as_source(source, self.nprocs()), as_tag(tag, b"tag", True),
                             status, False)
        self.prologue(backend)
        cdef int isource = as_source(source, self.nprocs())
        cdef int itag = as_tag(tag, b"tag", True)
        cdef MPI_Status *sp = status_ptr(status)
        cdef int flag = 0
        CHKERR(MPI_Iprobe(isource, itag, self.ob_mpi, &flag, sp))
        if flag:
            status_type(status, MPI_DATATYPE_NULL)
        return bool(flag)

    # -- Send modes (buffered, synchronous, ready) and Isendrecv -------------------

    cdef object send_in(self, int send_mode, object buf, object dest, object tag,
                        object backend, bint nonblocking):
        """Bsend/Ssend/Rsend and their I- forms (the modes of dispatch.h): on
        MPI its own send of that mode, elsewhere the backend's (compose.py)."""
        sub = self.sub(backend)
        if sub is not None:
            req = sub.run(SEND_MODE_NAMES[send_mode],
                          self.call_send(buf, dest, tag, None, VALIDATE, NULL, send_mode),
                          dest=dest, tag=tag)
            if nonblocking:
                return req
            req.Wait()
            return None
        if not nonblocking:
            self.call_send(buf, dest, tag, backend, BLOCKING, NULL, send_mode)
            return None
        cdef Request r = Request.__new__(Request)
        r.ob_buf = self.call_send(buf, dest, tag, backend, NONBLOCKING, &r.ob_mpi, send_mode)
        return r

    def Bsend(self, buf, dest, tag=0, *, backend=None):
        """Send a message in buffered mode (blocking until it is copied out).

        Arguments as ``Send``. On MPI the message is copied into the buffer
        attached with ``MPI.Attach_buffer`` (an ``mcr.Exception`` if none or
        too small); the Gloo and NCCL backends buffer every send themselves.
        """
        self.send_in(BUFFERED, buf, dest, tag, backend, False)

    def Ssend(self, buf, dest, tag=0, *, backend=None):
        """Send a message in synchronous mode: return once the receiver has
        started to receive it. Arguments as ``Send``."""
        self.send_in(SYNCHRONOUS, buf, dest, tag, backend, False)

    def Rsend(self, buf, dest, tag=0, *, backend=None):
        """Send a message in ready mode: the matching receive must already be
        posted (MPI may fail otherwise). Arguments as ``Send``."""
        self.send_in(READY, buf, dest, tag, backend, False)

    def Ibsend(self, buf, dest, tag=0, *, backend=None):
        """Start a buffered send; return a ``Request``. Arguments as ``Bsend``."""
        return self.send_in(BUFFERED, buf, dest, tag, backend, True)

    def Issend(self, buf, dest, tag=0, *, backend=None):
        """Start a synchronous send; return a ``Request``, complete once the
        receiver has started to receive. Arguments as ``Ssend``."""
        return self.send_in(SYNCHRONOUS, buf, dest, tag, backend, True)

    def Irsend(self, buf, dest, tag=0, *, backend=None):
        """Start a ready send; return a ``Request``. Arguments as ``Rsend``."""
        return self.send_in(READY, buf, dest, tag, backend, True)

    cdef _Msg call_isendrecv(self, object sendbuf, object dest, object sendtag,
                             object recvbuf, object source, object recvtag, object backend,
                             int mode, MPI_Request *req):
        self.prologue(backend)
        cdef int idest = as_rank(dest, self.nprocs(), b"dest", True)
        cdef int isource = as_source(source, self.nprocs())
        cdef int isendtag = as_tag(sendtag, b"sendtag", False)
        cdef int irecvtag = as_tag(recvtag, b"recvtag", True)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.sown = parse_simple(sendbuf, &m.s, False, b"sendbuf")
        m.rown = parse_simple(recvbuf, &m.r, True, b"recvbuf")
        check_disjoint(&m.s, &m.r)
        check_isendrecv(mode, b"Isendrecv")
        if needs_staging(m):
            stage(m, mode, 1, 1)
        cdef int ierr
        with nogil:
            ierr = mcr_isendrecv(mode, m.s.addr, m.s.count, m.s.dtype, idest, isendtag,
                                 m.r.addr, m.r.count, m.r.dtype, isource, irecvtag,
                                 self.ob_mpi, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    def Isendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None,
                  source=ANY_SOURCE, recvtag=ANY_TAG, *, backend=None):
        """Start sending one message and receiving another; return a
        ``Request`` (MPI-4). Arguments as ``Sendrecv``, less `status`: the
        request's ``Wait(status)`` gives the receive's.

        Raises
        ------
        NotImplementedError
            If the MPI library lacks ``MPI_Isendrecv`` (before MPI-4).
        """
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_isendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag,
                                    None, VALIDATE, NULL)
            return sub.run("Isendrecv", m, dest=dest, sendtag=sendtag, source=source,
                           tag=recvtag)
        cdef Request req = Request.__new__(Request)
        cdef _Msg m2 = self.call_isendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag,
                                           backend, NONBLOCKING, &req.ob_mpi)
        req.ob_buf = m2
        req.rtype = m2.r.dtype
        return req

    cdef _Msg call_isendrecv_replace(self, object buf, object dest, object sendtag,
                                     object source, object recvtag, object backend, int mode,
                                     MPI_Request *req):
        self.prologue(backend)
        cdef int idest = as_rank(dest, self.nprocs(), b"dest", True)
        cdef int isource = as_source(source, self.nprocs())
        cdef int isendtag = as_tag(sendtag, b"sendtag", False)
        cdef int irecvtag = as_tag(recvtag, b"recvtag", True)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.rown = parse_simple(buf, &m.r, True, b"buf")
        check_isendrecv(mode, b"Isendrecv_replace")
        if needs_staging(m):
            stage(m, mode, 1, 1)
        cdef int ierr
        with nogil:
            ierr = mcr_isendrecv_replace(mode, m.r.addr, m.r.count, m.r.dtype, idest,
                                         isendtag, isource, irecvtag, self.ob_mpi, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    def Isendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG,
                          *, backend=None):
        """Start sending `buf` and receiving into it; return a ``Request``
        (MPI-4). Arguments as ``Sendrecv_replace``, less `status`.

        Raises
        ------
        NotImplementedError
            If the MPI library lacks ``MPI_Isendrecv_replace`` (before MPI-4).
        """
        sub = self.sub(backend)
        if sub is not None:
            self.call_send(buf, dest, sendtag, None, VALIDATE, NULL)
            return sub.run("Sendrecv_replace",
                           self.call_recv(buf, source, recvtag, None, None, VALIDATE, NULL),
                           dest=dest, sendtag=sendtag, source=source, tag=recvtag)
        cdef Request req = Request.__new__(Request)
        cdef _Msg m = self.call_isendrecv_replace(buf, dest, sendtag, source, recvtag,
                                                  backend, NONBLOCKING, &req.ob_mpi)
        req.ob_buf = m
        req.rtype = m.r.dtype
        return req

    # -- Collectives -----------------------------------------------------------

    cdef _Msg call_barrier(self, object backend, int mode, MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef int ierr
        with nogil:
            ierr = mcr_barrier(mode, self.ob_mpi, info, req)
        CHKERR(ierr)
        return None

    cdef _Msg call_bcast(self, object buf, object root, object backend, int mode,
                         MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef int size = self.nprocs()
        cdef int iroot = as_rank(root, size, b"root", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_bcast(buf, iroot, self.myrank(), size)
        if needs_staging(m):
            stage(m, mode, 1, 1)
        cdef int ierr
        with nogil:
            ierr = mcr_bcast(mode, m.r.addr, m.r.count, m.r.dtype, iroot, self.ob_mpi, info, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    cdef _Msg call_gather(self, object sendbuf, object recvbuf, object root, bint v,
                          object backend, int mode, MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef int size = self.nprocs()
        cdef int iroot = as_rank(root, size, b"root", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_gather(sendbuf, recvbuf, iroot, self.myrank(), size, v)
        if needs_staging(m):
            stage(m, mode, 1, self.nprocs())
        cdef int ierr
        with nogil:
            if v:
                ierr = mcr_gatherv(mode, m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.counts,
                                   m.r.displs, m.r.dtype, iroot, self.ob_mpi, info, req)
            else:
                ierr = mcr_gather(mode, m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                  m.r.dtype, iroot, self.ob_mpi, info, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    cdef _Msg call_scatter(self, object sendbuf, object recvbuf, object root, bint v,
                           object backend, int mode, MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef int size = self.nprocs()
        cdef int iroot = as_rank(root, size, b"root", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_scatter(sendbuf, recvbuf, iroot, self.myrank(), size, v)
        if needs_staging(m):
            stage(m, mode, self.nprocs(), 1)
        cdef int ierr
        with nogil:
            if v:
                ierr = mcr_scatterv(mode, m.s.addr, m.s.counts, m.s.displs, m.s.dtype,
                                    m.r.addr, m.r.count, m.r.dtype, iroot, self.ob_mpi, info,
                                    req)
            else:
                ierr = mcr_scatter(mode, m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                   m.r.dtype, iroot, self.ob_mpi, info, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    cdef _Msg call_allgather(self, object sendbuf, object recvbuf, bint v, object backend,
                             int mode, MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_allgather(sendbuf, recvbuf, self.myrank(), self.nprocs(), v)
        if needs_staging(m):
            stage(m, mode, 1, self.nprocs())
        cdef int ierr
        with nogil:
            if v:
                ierr = mcr_allgatherv(mode, m.s.addr, m.s.count, m.s.dtype, m.r.addr,
                                      m.r.counts, m.r.displs, m.r.dtype, self.ob_mpi, info, req)
            else:
                ierr = mcr_allgather(mode, m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                     m.r.dtype, self.ob_mpi, info, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    cdef _Msg call_alltoall(self, object sendbuf, object recvbuf, bint v, object backend,
                            int mode, MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_alltoall(sendbuf, recvbuf, self.nprocs(), v)
        if needs_staging(m):
            stage(m, mode, self.nprocs(), self.nprocs())
        cdef int ierr
        with nogil:
            if v:
                ierr = mcr_alltoallv(mode, m.s.addr, m.s.counts, m.s.displs, m.s.dtype,
                                     m.r.addr, m.r.counts, m.r.displs, m.r.dtype, self.ob_mpi,
                                     info, req)
            else:
                ierr = mcr_alltoall(mode, m.s.addr, m.s.count, m.s.dtype, m.r.addr, m.r.count,
                                    m.r.dtype, self.ob_mpi, info, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    cdef _MsgW call_alltoallw(self, object sendbuf, object recvbuf, object backend, int mode,
                              MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef _MsgW m = _MsgW.__new__(_MsgW)
        cdef int size = self.nprocs()
        m.for_alltoallw(sendbuf, recvbuf, size)
        if size == 1 and mode != VALIDATE:
            m.move_own_block(self.ob_mpi)
        cdef int ierr
        with nogil:
            ierr = mcr_alltoallw(mode, m.saddr, m.scounts, m.sdispls, m.stypes, m.raddr,
                                 m.rcounts, m.rdispls, m.rtypes, self.ob_mpi, info, req)
        CHKERR(ierr)
        if detached:
            poll_detached()
        return m

    cdef _Msg call_reduce(self, object sendbuf, object recvbuf, object op, object root,
                          object backend, int mode, MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef int size = self.nprocs()
        cdef int iroot = as_rank(root, size, b"root", False)
        cdef _Msg m = _Msg.__new__(_Msg)
        m.for_reduce(sendbuf, recvbuf, iroot, self.myrank(), size)
        # the operand's side: the receive side when the root reduces in place
        cdef side *x = &m.r if m.s.addr == <char*>MPI_IN_PLACE else &m.s
        cdef MPI_Op mop
        resolve_op(op, x.tindex, &mop)
        if needs_staging(m):
            stage(m, mode, 1, 1)
        cdef int ierr
        with nogil:
            ierr = mcr_reduce(mode, m.s.addr, m.r.addr, x.count, x.dtype, mop, iroot,
                              self.ob_mpi, info, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    cdef _Msg call_allreduce(self, object sendbuf, object recvbuf, object op, int kind,
                             object backend, int mode, MPI_Info info, MPI_Request *req):
        # kind: 0 Allreduce, 1 Scan, 2 Exscan (same message shape)
        self.prologue(backend)
        cdef _Msg m = _Msg.__new__(_Msg)
        cdef MPI_Op mop
        m.for_allreduce(sendbuf, recvbuf)
        resolve_op(op, m.r.tindex, &mop)
        if needs_staging(m):
            stage(m, mode, 1, 1)
        cdef int ierr
        with nogil:
            if kind == 0:
                ierr = mcr_allreduce(mode, m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop,
                                     self.ob_mpi, info, req)
            elif kind == 1:
                ierr = mcr_scan(mode, m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop,
                                self.ob_mpi, info, req)
            else:
                ierr = mcr_exscan(mode, m.s.addr, m.r.addr, m.r.count, m.r.dtype, mop,
                                  self.ob_mpi, info, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m

    cdef _Msg call_reduce_scatter(self, object sendbuf, object recvbuf, object recvcounts,
                                  object op, bint block, object backend, int mode,
                                  MPI_Info info, MPI_Request *req):
        self.prologue(backend)
        cdef _Msg m = _Msg.__new__(_Msg)
        cdef MPI_Op mop
        if block:
            m.for_reduce_scatter_block(sendbuf, recvbuf, self.nprocs())
        else:
            m.for_reduce_scatter(sendbuf, recvbuf, recvcounts, self.myrank(), self.nprocs(),
                                 self.ob_mpi)
        resolve_op(op, m.r.tindex, &mop)
        if needs_staging(m):
            # in place, the input is the whole of recvbuf: one block per process
            stage(m, mode, 1, self.nprocs() if block and m.s.addr == <char*>MPI_IN_PLACE
                  else 1)
        cdef int ierr
        with nogil:
            if block:
                ierr = mcr_reduce_scatter_block(mode, m.s.addr, m.r.addr, m.r.count, m.r.dtype,
                                                mop, self.ob_mpi, info, req)
            else:
                ierr = mcr_reduce_scatter(mode, m.s.addr, m.r.addr, m.r.counts, m.r.dtype, mop,
                                          self.ob_mpi, info, req)
        CHKERR(ierr)
        finish_call(m, mode)
        return m


    def Barrier(self, *, backend=None):
        """Block until every process of the communicator has called it."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_barrier(None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Barrier", m).Wait()
            return
        self.call_barrier(backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Ibarrier(self, *, backend=None):
        """Start a barrier; return a ``Request``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_barrier(None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Ibarrier", m)
        cdef Request req = Request.__new__(Request)
        self.call_barrier(backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_bcast(buf, root, None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Bcast", m, root=root).Wait()
            return
        self.call_bcast(buf, root, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Ibcast(self, buf, root=0, *, backend=None):
        """Start a broadcast; return a ``Request``. Arguments as ``Bcast``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_bcast(buf, root, None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Ibcast", m, root=root)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_bcast(buf, root,
                                     backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_gather(sendbuf, recvbuf, root, False,
                                 None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Gather", m, root=root).Wait()
            return
        self.call_gather(sendbuf, recvbuf, root, False,
                         backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Igather(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Start a gather; return a ``Request``. Arguments as ``Gather``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_gather(sendbuf, recvbuf, root, False,
                                 None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Igather", m, root=root)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_gather(sendbuf, recvbuf, root, False,
                                      backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_gather(sendbuf, recvbuf, root, True,
                                 None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Gatherv", m, root=root).Wait()
            return
        self.call_gather(sendbuf, recvbuf, root, True,
                         backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Igatherv(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Start a vector gather; return a ``Request``. Arguments as ``Gatherv``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_gather(sendbuf, recvbuf, root, True,
                                 None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Igatherv", m, root=root)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_gather(sendbuf, recvbuf, root, True,
                                      backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_scatter(sendbuf, recvbuf, root, False,
                                  None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Scatter", m, root=root).Wait()
            return
        self.call_scatter(sendbuf, recvbuf, root, False,
                          backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Iscatter(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Start a scatter; return a ``Request``. Arguments as ``Scatter``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_scatter(sendbuf, recvbuf, root, False,
                                  None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Iscatter", m, root=root)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_scatter(sendbuf, recvbuf, root, False,
                                       backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_scatter(sendbuf, recvbuf, root, True,
                                  None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Scatterv", m, root=root).Wait()
            return
        self.call_scatter(sendbuf, recvbuf, root, True,
                          backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Iscatterv(self, sendbuf, recvbuf, root=0, *, backend=None):
        """Start a vector scatter; return a ``Request``. Arguments as ``Scatterv``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_scatter(sendbuf, recvbuf, root, True,
                                  None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Iscatterv", m, root=root)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_scatter(sendbuf, recvbuf, root, True,
                                       backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allgather(sendbuf, recvbuf, False,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Allgather", m).Wait()
            return
        self.call_allgather(sendbuf, recvbuf, False, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Iallgather(self, sendbuf, recvbuf, *, backend=None):
        """Start an allgather; return a ``Request``. Arguments as ``Allgather``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allgather(sendbuf, recvbuf, False,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Iallgather", m)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allgather(sendbuf, recvbuf, False,
                                         backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allgather(sendbuf, recvbuf, True,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Allgatherv", m).Wait()
            return
        self.call_allgather(sendbuf, recvbuf, True, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Iallgatherv(self, sendbuf, recvbuf, *, backend=None):
        """Start a vector allgather; return a ``Request``. Arguments as ``Allgatherv``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allgather(sendbuf, recvbuf, True,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Iallgatherv", m)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allgather(sendbuf, recvbuf, True,
                                         backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_alltoall(sendbuf, recvbuf, False,
                                   None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Alltoall", m).Wait()
            return
        self.call_alltoall(sendbuf, recvbuf, False, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Ialltoall(self, sendbuf, recvbuf, *, backend=None):
        """Start an all-to-all; return a ``Request``. Arguments as ``Alltoall``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_alltoall(sendbuf, recvbuf, False,
                                   None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Ialltoall", m)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_alltoall(sendbuf, recvbuf, False,
                                        backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_alltoall(sendbuf, recvbuf, True, None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Alltoallv", m).Wait()
            return
        self.call_alltoall(sendbuf, recvbuf, True, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Ialltoallv(self, sendbuf, recvbuf, *, backend=None):
        """Start a vector all-to-all; return a ``Request``. Arguments as ``Alltoallv``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_alltoall(sendbuf, recvbuf, True, None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Ialltoallv", m)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_alltoall(sendbuf, recvbuf, True,
                                        backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
        return req

    cdef object mpi_only(self, object backend, str name):
        """Refuse a backend other than MPI for an operation only MPI runs."""
        sub = self.sub(backend)
        if sub is not None:
            raise ValueError(f"{name}: backend {sub.name!r} cannot run it (one MPI "
                             f"datatype per process); use backend='mpi'")
        return None

    def Alltoallw(self, sendbuf, recvbuf, *, backend=None):
        """All-to-all with a count, byte displacement and datatype per process.

        Parameters
        ----------
        sendbuf : [buf, counts, displs, datatypes] or IN_PLACE
            Also ``[buf, (counts, displs), datatypes]`` and ``[buf,
            datatypes]`` (one element of each type at the start of `buf`):
            ``counts[j]`` elements of ``datatypes[j]`` from byte ``displs[j]``
            go to process ``j``. `buf` may be ``BOTTOM`` (absolute addresses).
        recvbuf : [buf, counts, displs, datatypes]
            The same forms: what process ``i`` sends lands at byte ``displs[i]``.

        Raises
        ------
        ValueError
            For a backend other than MPI, or a block past the end of its buffer.
        """
        self.mpi_only(backend, "Alltoallw")
        self.call_alltoallw(sendbuf, recvbuf, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Ialltoallw(self, sendbuf, recvbuf, *, backend=None):
        """Start an ``Alltoallw``; return a ``Request``. Arguments as ``Alltoallw``."""
        self.mpi_only(backend, "Ialltoallw")
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_alltoallw(sendbuf, recvbuf,
                                         backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_reduce(sendbuf, recvbuf, op, root,
                                 None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Reduce", m, op=op, root=root).Wait()
            return
        self.call_reduce(sendbuf, recvbuf, op, root, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root=0, *, backend=None):
        """Start a reduce; return a ``Request``. Arguments as ``Reduce``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_reduce(sendbuf, recvbuf, op, root,
                                 None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Ireduce", m, op=op, root=root)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_reduce(sendbuf, recvbuf, op, root,
                                      backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allreduce(sendbuf, recvbuf, op, 0,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Allreduce", m, op=op).Wait()
            return
        self.call_allreduce(sendbuf, recvbuf, op, 0, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Iallreduce(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start an allreduce; return a ``Request``. Arguments as ``Allreduce``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allreduce(sendbuf, recvbuf, op, 0,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Iallreduce", m, op=op)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allreduce(sendbuf, recvbuf, op, 0,
                                         backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_reduce_scatter(sendbuf, recvbuf, None, op, True,
                                         None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Reduce_scatter_block", m, op=op).Wait()
            return
        self.call_reduce_scatter(sendbuf, recvbuf, None, op, True,
                                 backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start a reduce-scatter-block; return a ``Request``. Arguments as
        ``Reduce_scatter_block``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_reduce_scatter(sendbuf, recvbuf, None, op, True,
                                         None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Ireduce_scatter_block", m, op=op)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_reduce_scatter(sendbuf, recvbuf, None, op, True,
                                              backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
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
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_reduce_scatter(sendbuf, recvbuf, recvcounts, op, False,
                                         None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Reduce_scatter", m, op=op).Wait()
            return
        self.call_reduce_scatter(sendbuf, recvbuf, recvcounts, op, False,
                                 backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM, *, backend=None):
        """Start a reduce-scatter; return a ``Request``. Arguments as ``Reduce_scatter``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_reduce_scatter(sendbuf, recvbuf, recvcounts, op, False,
                                         None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Ireduce_scatter", m, op=op)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_reduce_scatter(sendbuf, recvbuf, recvcounts, op, False,
                                              backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
        return req

    def Scan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Inclusive prefix reduction: rank ``i`` gets the reduction of ranks 0..i.

        Arguments as ``Allreduce``.
        """
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allreduce(sendbuf, recvbuf, op, 1,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Scan", m, op=op).Wait()
            return
        self.call_allreduce(sendbuf, recvbuf, op, 1, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Iscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start an inclusive scan; return a ``Request``. Arguments as ``Scan``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allreduce(sendbuf, recvbuf, op, 1,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Iscan", m, op=op)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allreduce(sendbuf, recvbuf, op, 1,
                                         backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
        return req

    def Exscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Exclusive prefix reduction: rank ``i`` gets the reduction of ranks
        0..i-1; `recvbuf` at rank 0 is left undefined (as in MPI).

        Arguments as ``Allreduce``.
        """
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allreduce(sendbuf, recvbuf, op, 2,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            sub.run("Exscan", m, op=op).Wait()
            return
        self.call_allreduce(sendbuf, recvbuf, op, 2, backend, BLOCKING, MPI_INFO_NULL, NULL)

    def Iexscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start an exclusive scan; return a ``Request``. Arguments as ``Exscan``."""
        sub = self.sub(backend)
        if sub is not None:
            m = self.call_allreduce(sendbuf, recvbuf, op, 2,
                                    None, VALIDATE, MPI_INFO_NULL, NULL)
            return sub.run("Iexscan", m, op=op)
        cdef Request req = Request.__new__(Request)
        req.ob_buf = self.call_allreduce(sendbuf, recvbuf, op, 2,
                                         backend, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
        return req

    # -- Persistent point-to-point and collectives --------------------------------

    def Send_init(self, buf, dest, tag=0, *, backend=None):
        """Create a persistent send; return an inactive ``Prequest``.

        Arguments as ``Send``; each ``Start`` sends what `buf` holds then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_send(buf, dest, tag, backend,
                                  VALIDATE if req.foreign else PERSISTENT, &req.ob_mpi)
        if req.foreign:
            req.emulate(self.Isend, (buf, dest, tag), backend)
        else:
            req.ob_buf = req.keep         # staged device buffers: copied at each start
        return req

    def Recv_init(self, buf, source=ANY_SOURCE, tag=ANY_TAG, *, backend=None):
        """Create a persistent receive; return an inactive ``Prequest``.

        Arguments as ``Recv``; each ``Start`` receives into `buf` again.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        cdef _Msg m = self.call_recv(buf, source, tag, None, backend,
                                     VALIDATE if req.foreign else PERSISTENT, &req.ob_mpi)
        req.keep = m
        req.rtype = m.r.dtype
        if req.foreign:
            req.emulate(self.Irecv, (buf, source, tag), backend)
        else:
            req.ob_buf = m
        return req

    cdef Prequest send_init_in(self, int send_mode, object buf, object dest, object tag,
                               object backend, object nonblocking):
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_send(buf, dest, tag, backend,
                                  VALIDATE if req.foreign else PERSISTENT, &req.ob_mpi,
                                  send_mode)
        if req.foreign:
            req.emulate(nonblocking, (buf, dest, tag), backend)
        else:
            req.ob_buf = req.keep         # staged device buffers: copied at each start
        return req

    def Bsend_init(self, buf, dest, tag=0, *, backend=None):
        """Create a persistent buffered send; return an inactive ``Prequest``.

        Arguments as ``Bsend``; each ``Start`` sends what `buf` holds then.
        """
        return self.send_init_in(BUFFERED, buf, dest, tag, backend, self.Ibsend)

    def Ssend_init(self, buf, dest, tag=0, *, backend=None):
        """Create a persistent synchronous send; return an inactive ``Prequest``.

        Arguments as ``Ssend``; each ``Start`` sends what `buf` holds then.
        """
        return self.send_init_in(SYNCHRONOUS, buf, dest, tag, backend, self.Issend)

    def Rsend_init(self, buf, dest, tag=0, *, backend=None):
        """Create a persistent ready send; return an inactive ``Prequest``.

        Arguments as ``Rsend``; each ``Start`` sends what `buf` holds then.
        """
        return self.send_init_in(READY, buf, dest, tag, backend, self.Irsend)

    def Barrier_init(self, info=None, *, backend=None):
        """Create a persistent Barrier; return an inactive ``Prequest``.

        Arguments as ``Barrier``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_barrier(backend, req.form(),
                                    as_info(info), &req.ob_mpi)
        req.emulate(self.Ibarrier, (), backend)
        return req

    def Bcast_init(self, buf, root=0, info=None, *, backend=None):
        """Create a persistent Bcast; return an inactive ``Prequest``.

        Arguments as ``Bcast``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_bcast(buf, root, backend, req.form(),
                                  as_info(info), &req.ob_mpi)
        req.emulate(self.Ibcast, (buf, root), backend)
        return req

    def Gather_init(self, sendbuf, recvbuf, root=0, info=None, *, backend=None):
        """Create a persistent Gather; return an inactive ``Prequest``.

        Arguments as ``Gather``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_gather(sendbuf, recvbuf, root, False, backend, req.form(),
                                   as_info(info), &req.ob_mpi)
        req.emulate(self.Igather, (sendbuf, recvbuf, root), backend)
        return req

    def Gatherv_init(self, sendbuf, recvbuf, root=0, info=None, *, backend=None):
        """Create a persistent Gatherv; return an inactive ``Prequest``.

        Arguments as ``Gatherv``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_gather(sendbuf, recvbuf, root, True, backend, req.form(),
                                   as_info(info), &req.ob_mpi)
        req.emulate(self.Igatherv, (sendbuf, recvbuf, root), backend)
        return req

    def Scatter_init(self, sendbuf, recvbuf, root=0, info=None, *, backend=None):
        """Create a persistent Scatter; return an inactive ``Prequest``.

        Arguments as ``Scatter``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_scatter(sendbuf, recvbuf, root, False, backend, req.form(),
                                    as_info(info), &req.ob_mpi)
        req.emulate(self.Iscatter, (sendbuf, recvbuf, root), backend)
        return req

    def Scatterv_init(self, sendbuf, recvbuf, root=0, info=None, *, backend=None):
        """Create a persistent Scatterv; return an inactive ``Prequest``.

        Arguments as ``Scatterv``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_scatter(sendbuf, recvbuf, root, True, backend, req.form(),
                                    as_info(info), &req.ob_mpi)
        req.emulate(self.Iscatterv, (sendbuf, recvbuf, root), backend)
        return req

    def Allgather_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Create a persistent Allgather; return an inactive ``Prequest``.

        Arguments as ``Allgather``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_allgather(sendbuf, recvbuf, False, backend, req.form(),
                                      as_info(info), &req.ob_mpi)
        req.emulate(self.Iallgather, (sendbuf, recvbuf), backend)
        return req

    def Allgatherv_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Create a persistent Allgatherv; return an inactive ``Prequest``.

        Arguments as ``Allgatherv``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_allgather(sendbuf, recvbuf, True, backend, req.form(),
                                      as_info(info), &req.ob_mpi)
        req.emulate(self.Iallgatherv, (sendbuf, recvbuf), backend)
        return req

    def Alltoall_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Create a persistent Alltoall; return an inactive ``Prequest``.

        Arguments as ``Alltoall``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_alltoall(sendbuf, recvbuf, False, backend, req.form(),
                                     as_info(info), &req.ob_mpi)
        req.emulate(self.Ialltoall, (sendbuf, recvbuf), backend)
        return req

    def Alltoallv_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Create a persistent Alltoallv; return an inactive ``Prequest``.

        Arguments as ``Alltoallv``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_alltoall(sendbuf, recvbuf, True, backend, req.form(),
                                     as_info(info), &req.ob_mpi)
        req.emulate(self.Ialltoallv, (sendbuf, recvbuf), backend)
        return req

    def Alltoallw_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Create a persistent Alltoallw; return an inactive ``Prequest``.

        Arguments as ``Alltoallw``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        self.mpi_only(backend, "Alltoallw_init")
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        # one process: the block moves at each start (call_alltoallw), so emulated
        cdef bint alone = self.prologue(backend) == 0 and self.nprocs() == 1
        req.keep = self.call_alltoallw(sendbuf, recvbuf, backend,
                                       VALIDATE if alone else req.form(),
                                       as_info(info), &req.ob_mpi)
        if alone:
            req.start_fn = partial(self.Ialltoallw, sendbuf, recvbuf, backend=backend)
        else:
            req.emulate(self.Ialltoallw, (sendbuf, recvbuf), backend)
        return req

    def Reduce_init(self, sendbuf, recvbuf, op=SUM, root=0, info=None, *, backend=None):
        """Create a persistent Reduce; return an inactive ``Prequest``.

        Arguments as ``Reduce``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_reduce(sendbuf, recvbuf, op, root, backend, req.form(),
                                   as_info(info), &req.ob_mpi)
        req.emulate(self.Ireduce, (sendbuf, recvbuf, op, root), backend)
        return req

    def Allreduce_init(self, sendbuf, recvbuf, op=SUM, info=None, *, backend=None):
        """Create a persistent Allreduce; return an inactive ``Prequest``.

        Arguments as ``Allreduce``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_allreduce(sendbuf, recvbuf, op, 0, backend, req.form(),
                                      as_info(info), &req.ob_mpi)
        req.emulate(self.Iallreduce, (sendbuf, recvbuf, op), backend)
        return req

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=SUM, info=None, *, backend=None):
        """Create a persistent Reduce_scatter_block; return an inactive ``Prequest``.

        Arguments as ``Reduce_scatter_block``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_reduce_scatter(sendbuf, recvbuf, None, op, True, backend, req.form(),
                                           as_info(info), &req.ob_mpi)
        req.emulate(self.Ireduce_scatter_block, (sendbuf, recvbuf, op), backend)
        return req

    def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=SUM, info=None, *, backend=None):
        """Create a persistent Reduce_scatter; return an inactive ``Prequest``.

        Arguments as ``Reduce_scatter``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_reduce_scatter(sendbuf, recvbuf, recvcounts, op, False, backend, req.form(),
                                           as_info(info), &req.ob_mpi)
        req.emulate(self.Ireduce_scatter, (sendbuf, recvbuf, recvcounts, op), backend)
        return req

    def Scan_init(self, sendbuf, recvbuf, op=SUM, info=None, *, backend=None):
        """Create a persistent Scan; return an inactive ``Prequest``.

        Arguments as ``Scan``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_allreduce(sendbuf, recvbuf, op, 1, backend, req.form(),
                                      as_info(info), &req.ob_mpi)
        req.emulate(self.Iscan, (sendbuf, recvbuf, op), backend)
        return req

    def Exscan_init(self, sendbuf, recvbuf, op=SUM, info=None, *, backend=None):
        """Create a persistent Exscan; return an inactive ``Prequest``.

        Arguments as ``Exscan``, plus `info` (an ``MPI.Info`` or None); each
        ``Start`` runs the operation on what the buffers hold then.
        """
        cdef Prequest req = Prequest.__new__(Prequest)
        req.comm = self
        req.foreign = self.sub(backend) is not None
        req.keep = self.call_allreduce(sendbuf, recvbuf, op, 2, backend, req.form(),
                                      as_info(info), &req.ob_mpi)
        req.emulate(self.Iexscan, (sendbuf, recvbuf, op), backend)
        return req

    # -- Communicator management -------------------------------------------------

    def Free(self):
        """Free the communicator (collective over its processes).

        Freeing a null communicator (already freed, or from ``Split`` with
        ``UNDEFINED``) does nothing, so ``Free`` is idempotent; afterwards every
        operation on this object raises ``ValueError``. Other Python objects
        that share the handle (``comm.to_mpi4py()``, ``mcr.Comm(comm)``) must
        not be used after it either.

        Raises
        ------
        mcr.Exception
            For ``COMM_WORLD`` and ``COMM_SELF``, which MPI does not free
            (error class ``MPI.ERR_COMM``, as mpi4py raises).
        """
        if self.ob_mpi == MPI_COMM_NULL:
            return None
        if self.ob_mpi == MPI_COMM_WORLD or self.ob_mpi == MPI_COMM_SELF:
            # MPI_Comm_free would report it through the communicator's error
            # handler, which may be ERRORS_ARE_FATAL: raise MPI's error here
            raise Exception(MPI_ERR_COMM)
        if _backends is not None:
            _backends.release(self)       # the Gloo/NCCL sub-communicators first
        cdef int ierr
        with nogil:
            ierr = MPI_Comm_free(&self.ob_mpi)
        CHKERR(ierr)

    def Dup(self, info=None):
        """Duplicate the communicator: same processes, new context; the copy
        has the same class and default ``backend``, and its own backend
        sub-communicators (made at its first call on each backend)."""
        if info is None:
            return self.inherit(_MPI.Intracomm.Dup(self))
        return self.inherit(_MPI.Intracomm.Dup(self, info))

    def Clone(self):
        """Duplicate the communicator, as ``Dup`` without hints."""
        return self.inherit(_MPI.Intracomm.Clone(self))

    cdef object inherit(self, object comm):
        # mpi4py's Dup and Clone make an object of type(self): a user's
        # subclass stays one, as with mpi4py
        (<Comm>comm).dflt = self.dflt
        return comm

    cdef Comm derived(self, _MPI.Comm comm):
        cdef Comm out = as_comm(comm)
        out.dflt = self.dflt
        return out

    def Split(self, int color=0, int key=0):
        """Split into disjoint communicators by `color`, ordered by `key`.

        Returns an ``mcr.Comm``; with ``color=UNDEFINED`` a null one (as
        mpi4py's ``COMM_NULL``), on which every operation raises ``ValueError``.
        """
        return self.derived(_MPI.Intracomm.Split(self, color, key))

    def Split_type(self, int split_type, int key=0, info=None):
        """Split by a type such as ``COMM_TYPE_SHARED`` (processes sharing memory),
        ordered by `key`; returns an ``mcr.Comm`` (null for ``UNDEFINED``)."""
        if info is None:
            return self.derived(_MPI.Intracomm.Split_type(self, split_type, key))
        return self.derived(_MPI.Intracomm.Split_type(self, split_type, key, info))

    def Create(self, group):
        """Create a communicator from a group (collective); see mpi4py."""
        return self.derived(_MPI.Intracomm.Create(self, group))

    def Create_group(self, group, int tag=0):
        """Create a communicator from a group (collective over the group); see mpi4py."""
        return self.derived(_MPI.Intracomm.Create_group(self, group, tag))

    # -- Handles and pickling --------------------------------------------------------

    @classmethod
    def fromhandle(cls, handle):
        """Create an object of this class from an MPI handle (an integer).

        Raises
        ------
        TypeError
            If the handle is an intercommunicator.
        """
        return of_class(cls, _MPI.Comm.fromhandle(handle))

    @classmethod
    def fromint(cls, arg):
        """Create an object of this class from the integer of ``toint()``."""
        return of_class(cls, _MPI.Comm.fromint(arg))

    @classmethod
    def f2py(cls, arg):
        """Create an object of this class from a Fortran handle (``py2f()``)."""
        return of_class(cls, _MPI.Comm.f2py(arg))

    def __reduce__(self):
        # COMM_WORLD and COMM_SELF pickle by name, and unpickle as themselves;
        # an equal copy as a copy of them (mpi4py pickles only these handles)
        if self is COMM_WORLD or self is COMM_SELF:
            return "COMM_WORLD" if self is COMM_WORLD else "COMM_SELF"
        if self.ob_mpi == MPI_COMM_WORLD:
            return (_newobj, (type(self), COMM_WORLD))
        if self.ob_mpi == MPI_COMM_SELF:
            return (_newobj, (type(self), COMM_SELF))
        return _MPI.Intracomm.__reduce__(self)


cdef object _newobj = __import__("copyreg").__newobj__


cdef Comm as_comm(_MPI.Comm comm):
    cdef Comm out = Comm.__new__(Comm)
    out.ob_mpi = comm.ob_mpi
    return out


cdef object of_class(type cls, _MPI.Comm comm):
    """An object of `cls` (Comm or a subclass) sharing `comm`'s handle."""
    if comm.ob_mpi != MPI_COMM_NULL and not isinstance(comm, _MPI.Intracomm):
        raise TypeError(f"handle: {cls.__name__} is an intracommunicator, the handle "
                        f"is a {type(comm).__name__}")
    cdef Comm out = <Comm>cls.__new__(cls)
    out.ob_mpi = comm.ob_mpi
    return out


# mpi4py's flag for its module constants: their free() leaves them alone
# (PyMPI_FLAGS_CONST in mpi4py's objmodel.pxi)
cdef enum:
    FLAGS_CONST = 1 << 1


cdef Comm predefined_comm(MPI_Comm handle):
    # no MPI call: mpi4py's constructor (Comm(comm)) would call
    # MPI_Comm_test_inter, which needs MPI initialized
    cdef Comm out = Comm.__new__(Comm)
    out.ob_mpi = handle
    out.flags |= FLAGS_CONST
    return out


cdef object ENV_BACKEND = default_backend()
