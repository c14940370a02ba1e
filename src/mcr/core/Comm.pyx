# Comm: an mpi4py Intracomm whose buffer methods run on tensors and any buffer.
# Each public method makes its call (a _Call: the operation, form, backend and
# arguments by name) and hands it to Comm.call, which runs it through the
# communicator's interceptors (chain.pxi) and posts it with the functions of
# the operation's descriptor (ops.pxi); the rest of Comm is in commbase.pxi.

cdef object SUM = _mpi4py.SUM
cdef object ANY_SOURCE = _mpi4py.ANY_SOURCE
cdef object ANY_TAG = _mpi4py.ANY_TAG
cdef int TAG_UB = 32767          # MPI guarantees >= 32767; MPI's value is read lazily
cdef bint tag_ub_read = False

# mpi4py's collectives on pickled objects, which mcr's pass on to (bound once:
# a lookup per call costs as much as the rest of mcr's part)
cdef object _obj_barrier = _MPI.Intracomm.barrier
cdef object _obj_bcast = _MPI.Intracomm.bcast
cdef object _obj_gather = _MPI.Intracomm.gather
cdef object _obj_scatter = _MPI.Intracomm.scatter
cdef object _obj_allgather = _MPI.Intracomm.allgather
cdef object _obj_alltoall = _MPI.Intracomm.alltoall
cdef object _obj_reduce = _MPI.Intracomm.reduce
cdef object _obj_allreduce = _MPI.Intracomm.allreduce
cdef object _obj_scan = _MPI.Intracomm.scan
cdef object _obj_exscan = _MPI.Intracomm.exscan
# and its point-to-point methods on pickled objects (obj_p2p in checkimpl.pxi
# times them)
cdef object _obj_send = _MPI.Comm.send
cdef object _obj_ssend = _MPI.Comm.ssend
cdef object _obj_recv = _MPI.Comm.recv
cdef object _obj_sendrecv = _MPI.Comm.sendrecv
cdef object _obj_probe = _MPI.Comm.probe
cdef object _obj_mprobe = _MPI.Comm.mprobe
cdef object _obj_isend = _MPI.Comm.isend
cdef object _obj_issend = _MPI.Comm.issend
cdef object _obj_irecv = _MPI.Comm.irecv
cdef object _obj_iprobe = _MPI.Comm.iprobe
cdef object _obj_improbe = _MPI.Comm.improbe
cdef object _msg_recv = _MPI.Message.recv


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


cdef int check_backend(object backend) except -1:
    if backend == "mpi" or backend == "auto":
        return 0
    backends_module().check_name(backend)
    return 0


cdef object default_backend():
    """The backend new communicators use: $MCR_BACKEND, else MPI (None)."""
    import os
    name = os.environ.get("MCR_BACKEND", "").strip() or None
    if name is not None:
        try:
            check_backend(name)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"MCR_BACKEND: {exc}") from None
    return None if name == "mpi" else AUTO_NAME if name == "auto" else name


@cython.final
cdef class _BadBackend:
    """A call's backend that could not be had (an unknown name, a backend
    that cannot start here), in place of its Subcomm on the interceptor
    chain: refused as the call's other arguments are, when it is parsed
    (Comm.parse), so that checked mode shares the refusal before any process
    communicates."""
    cdef readonly str name      # as the call named it (what auto's c.name reads)
    cdef object exc

    def __cinit__(self, name, exc):
        self.name, self.exc = str(name), exc


include "commbase.pxi"


cdef class Comm(_CommBase):
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
    cdef inline object sub(self, object backend):
        """The sub-communicator of a backend other than MPI to run on, None for
        MPI (the fast path: two pointer tests when nothing is chosen), or
        AUTO_SUB for auto."""
        if backend is None:
            backend = self.dflt
            if backend is None:
                return None
        if backend is AUTO_NAME:          # the default, as the setter keeps it
            return AUTO_SUB
        if backend == "mpi":
            return None
        if backend == "auto":
            return AUTO_SUB
        backends_module().check_name(backend)
        if self.ob_mpi == MPI_COMM_NULL:
            self.prologue(None)           # the null-communicator error
        return backends_module().subcomm(self, backend)

    # -- Point-to-point ------------------------------------------------------

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
        return self.call(send_call(CALL_SEND, BLOCKING, backend, buf, dest, tag))

    def Isend(self, buf, dest, tag=0, *, backend=None):
        """Start sending a message; return a ``Request``. Arguments as ``Send``."""
        return self.call(send_call(CALL_SEND, NONBLOCKING, backend, buf, dest, tag))

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
        return self.call(recv_call(BLOCKING, backend, buf, source, tag, status))

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, *, backend=None):
        """Start receiving a message; return a ``Request``. Arguments as ``Recv``."""
        return self.call(recv_call(NONBLOCKING, backend, buf, source, tag, None))

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
        return self.call(sendrecv_call(BLOCKING, backend, sendbuf, dest, sendtag, recvbuf, source,
                                       recvtag, status))

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
        return self.call(replace_call(BLOCKING, backend, buf, dest, sendtag, source, recvtag,
                                      status))

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
        if sub is not None and sub is not AUTO_SUB:       # auto: MPI (point-to-point)
            check_status(status)
            return sub.probe(as_source(source, self.nprocs()), as_tag(tag, b"tag", True),
                             status, True)
        self.prologue(backend)
        cdef int isource = as_source(source, self.nprocs())
        cdef int itag = as_tag(tag, b"tag", True)
        cdef MPI_Status *sp = status_ptr(status)
        cdef int ierr
        if self.watch is not None and self.watch.timeout > 0:
            probe_timed(self, self.watch.timeout, isource, itag, sp)
            status_type(status, MPI_DATATYPE_NULL)
            return True
        window = progress_enter()
        try:
            with nogil:
                ierr = MPI_Probe(isource, itag, self.ob_mpi, sp)
        finally:
            progress_exit(window)
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
        if sub is not None and sub is not AUTO_SUB:       # auto: MPI (point-to-point)
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

    # -- Send modes (buffered, synchronous, ready), Isendrecv ------------------------

    def Bsend(self, buf, dest, tag=0, *, backend=None):
        """Send a message in buffered mode (blocking until it is copied out).

        Arguments as ``Send``. On MPI the message is copied into the buffer
        attached with ``MPI.Attach_buffer`` (an ``mcr.Exception`` if none or
        too small); the Gloo and NCCL backends buffer every send themselves.
        """
        return self.call(send_call(CALL_BSEND, BLOCKING, backend, buf, dest, tag))

    def Ssend(self, buf, dest, tag=0, *, backend=None):
        """Send a message in synchronous mode: return once the receiver has
        started to receive it. Arguments as ``Send``."""
        return self.call(send_call(CALL_SSEND, BLOCKING, backend, buf, dest, tag))

    def Rsend(self, buf, dest, tag=0, *, backend=None):
        """Send a message in ready mode: the matching receive must already be
        posted (MPI may fail otherwise). Arguments as ``Send``."""
        return self.call(send_call(CALL_RSEND, BLOCKING, backend, buf, dest, tag))

    def Ibsend(self, buf, dest, tag=0, *, backend=None):
        """Start a buffered send; return a ``Request``. Arguments as ``Bsend``."""
        return self.call(send_call(CALL_BSEND, NONBLOCKING, backend, buf, dest, tag))

    def Issend(self, buf, dest, tag=0, *, backend=None):
        """Start a synchronous send; return a ``Request``, complete once the
        receiver has started to receive. Arguments as ``Ssend``."""
        return self.call(send_call(CALL_SSEND, NONBLOCKING, backend, buf, dest, tag))

    def Irsend(self, buf, dest, tag=0, *, backend=None):
        """Start a ready send; return a ``Request``. Arguments as ``Rsend``."""
        return self.call(send_call(CALL_RSEND, NONBLOCKING, backend, buf, dest, tag))

    def Isendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None,
                  source=ANY_SOURCE, recvtag=ANY_TAG, *, backend=None):
        """Start sending one message and receiving another; return a
        ``Request`` (MPI-4). Arguments as ``Sendrecv``, less `status`: the
        request's ``Wait(status)`` gives the receive's.

        Where the MPI library lacks ``MPI_Isendrecv`` (before MPI-4), or is
        MPICH, whose ``MPI_Isendrecv`` leaves the status unset, mcr posts an
        ``Irecv`` and an ``Isend`` under one request instead.
        """
        return self.call(sendrecv_call(NONBLOCKING, backend, sendbuf, dest, sendtag, recvbuf,
                                       source, recvtag, None))

    def Isendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG,
                          *, backend=None):
        """Start sending `buf` and receiving into it; return a ``Request``
        (MPI-4). Arguments as ``Sendrecv_replace``, less `status`.

        Composed as ``Isendrecv`` is where MPI's lacks or leaves the status
        unset; the message sent is then a packed copy of `buf`.
        """
        return self.call(replace_call(NONBLOCKING, backend, buf, dest, sendtag, source, recvtag,
                                      None))

    # -- The one call path ---------------------------------------------------------
    #
    # Every buffer method is one line: self.call(the _Call of its operation,
    # form, backend and arguments). `call` chooses the backend, runs the call
    # through the communicator's interceptors (chain.pxi; none: one pointer
    # test), parses it once (its descriptor's parse, ops.pxi), then posts it
    # on MPI or on the backend's Subcomm, and returns None, a Request or a
    # Prequest.

    cdef object call(self, _Call c):
        if (c.backend is None and self.dflt is None and c.compress is None
                and self.epoch == chain_epoch and self.chain is None and c.form == BLOCKING):
            # the fast path, in pointer tests (no reference counting on None):
            # blocking, on MPI, no interceptor
            self.parse(c)
            self.post_mpi(c, BLOCKING, MPI_INFO_NULL, NULL)
            recycle(c)
            return None
        cdef object sub
        if self.current_chain() is None and c.compress is None:
            sub = self.sub(c.backend)
            if sub is None:
                return self.on_mpi(c, False)
            if sub is AUTO_SUB:
                return self.on_auto(c)
            return self.on_backend(sub, c, c.backend)
        c.sub = self.chained_sub(c.backend)
        c.chain = self.chain if c.compress is None else self.zchain
        if c.form != NONBLOCKING:
            return proceed(self, c, 0)
        # (an interceptor may answer with a request of its own: compression's)
        return pending_on(self, proceed(self, c, 0))

    cdef object chained_sub(self, object backend):
        """sub(backend) for a call on the interceptor chain, or the
        _BadBackend that it raised for (refused when the call is parsed)."""
        try:
            return self.sub(backend)
        except _builtins.Exception as exc:
            return _BadBackend(backend, exc)

    cdef int parse(self, _Call c) except -1:
        """Check and parse the call's arguments, once."""
        if c.sub is not None and type(c.sub) is _BadBackend:
            raise (<_BadBackend>c.sub).exc
        if not c.parsed:
            OP_TABLE[c.op].parse(self, c)
            c.parsed = True
        return 0

    cdef object post_call(self, _Call c):
        """The end of the chain: post the call on its backend."""
        if c.op == COMM_OP or c.op == COMM_P2P_OP:
            return c.make(self, *c.makeargs)
        if c.op >= CALL_COUNT:
            return nb_run(self, c.op - CALL_COUNT, c.form, c.sendbuf, c.recvbuf, c.backend,
                          c.info)
        if c.sub is None:                 # (auto has chosen: it is in every chain)
            return self.on_mpi(c, False)
        if type(c.sub) is _BadBackend:
            raise (<_BadBackend>c.sub).exc
        return self.on_backend(c.sub, c, c.backend)

    def _again(self, c, backend):
        """Post the call `c` again, non-blocking, on `backend`: what an
        emulated persistent request does at each Start."""
        return self.call((<_Call?>c).again(NONBLOCKING, backend))

    cdef object on_mpi(self, _Call c, bint choose):
        """Post the call on MPI. Under auto (`choose`), a collective first asks
        the tuning table, once parsed, and goes to the backend it names when
        that is not MPI (on_chosen)."""
        cdef Request req
        if c.form == PERSISTENT:
            return self.persistent_mpi(c, choose)
        self.parse(c)
        if choose and self.chosen_other(c):
            return self.on_chosen(c)
        if c.form == BLOCKING:
            self.post_mpi(c, BLOCKING, MPI_INFO_NULL, NULL)
            return None
        req = Request.__new__(Request)
        self.post_mpi(c, NONBLOCKING, MPI_INFO_NULL, &req.ob_mpi)
        req.ob_buf = c
        owned_by(req, self)
        if OP_TABLE[c.op].flags & OP_RECEIVES:
            req.rtype = c.r.dtype
            if c.parts is not None:
                req.ext, c.parts = c.parts, None
        return req

    cdef object persistent_mpi(self, _Call c, bint choose):
        """A persistent request of the call on MPI: MPI's own, or emulated by
        a non-blocking call at each Start."""
        if OP_TABLE[c.op].flags & OP_NO_PERSISTENT:
            raise ValueError(f"{CALL_NAMES[c.op]} has no persistent form")
        cdef MPI_Info info = as_info(c.info)
        cdef Prequest preq
        # persistent point-to-point is MPI-1; persistent collectives may be emulated
        cdef bint emulated = c.op > CALL_RECV and emulate_persistent
        self.parse(c)
        if choose and self.chosen_other(c):
            return self.on_chosen(c)
        if c.op == CALL_RECV and c.isource == MPI_PROC_NULL and library_is_mpich():
            emulated = True       # MPICH's status of one says ANY_SOURCE: an Irecv at each start
        if c.op == CALL_ALLTOALLW and self.nprocs() == 1:
            emulated = True       # one process: the block moves at each start (mpi_alltoallw)
        if c.op == CALL_REDUCE_SCATTER and mpich_copies_onto_itself(self, c):
            emulated = True       # the input copied at each start (mpi_reduce_scatter)
        if emulated:              # (auto chose MPI: each Start runs on MPI)
            preq = emulated_prequest(self, partial(self._again, c, "mpi" if choose else
                                                   c.backend), c)
        else:
            preq = Prequest.__new__(Prequest)
            preq.comm, preq.keep = self, c
            self.post_mpi(c, PERSISTENT, info, &preq.ob_mpi)
            preq.ob_buf = c       # staged device buffers are copied at each start
            preq.places = None if c.staged is not None else tensor_places(c)
            c.live = False        # (not started: nothing to copy back)
            preq.op = c.op + 1
        if OP_TABLE[c.op].flags & OP_RECEIVES:
            preq.rtype = c.r.dtype
        return preq

    cdef int post_mpi(self, _Call c, int form, MPI_Info info, MPI_Request *req) except -1:
        """Post the parsed call on MPI in `form`, its device buffers staged
        through host memory where MPI cannot read them."""
        if needs_staging(c):
            stage(c, max(c.sblocks, 1), max(c.rblocks, 1))
        OP_TABLE[c.op].post_mpi(self, c, form, info, req)
        finish_call(c, form)
        return 0

    cdef object on_auto(self, _Call c):
        """Run the call on the backend auto chooses for it: MPI for
        point-to-point and Alltoallw; for a collective, the tuning table's
        choice for its size and device (auto.pxi), the ranks agreeing on the
        table first."""
        if always_mpi(c.op):
            return self.on_mpi(c, False)
        if self.chooser is None or not self.chooser.agreed:
            self.prologue(None)
            self.agreed_chooser()
        return self.on_mpi(c, True)

    cdef _Chooser agreed_chooser(self):
        if self.chooser is None:
            self.chooser = load_chooser(self)
        if not self.chooser.agreed:
            agree(self, self.chooser)
        return self.chooser

    cdef bint chosen_other(self, _Call c) noexcept:
        """Under auto, once the call is parsed: choose its backend; True when
        it is not MPI."""
        cdef _Chooser ch = self.chooser
        ch.last_dev = on_device(c)
        ch.last_key = auto_key(c.op, c, self.ob_mpi)
        ch.last = ch.lookup(c.op, ch.last_dev, ch.last_key)
        return ch.last != 0

    cdef object on_chosen(self, _Call c):
        """Post the parsed call on the backend auto chose (not MPI)."""
        name = self.chooser.names[self.chooser.last]
        return self.on_parsed(backends_module().subcomm(self, name), c, name)

    cdef str auto_name(self, _Call c):
        """The backend auto chooses for this call (the hooks are told it)."""
        if always_mpi(c.op):
            return "mpi"
        self.prologue(None)
        cdef _Chooser ch = self.agreed_chooser()
        self.parse(c)
        self.chosen_other(c)
        return ch.names[ch.last]

    def choose(self, op, nbytes=0, device="cpu"):
        """What ``backend="auto"`` runs an operation on, and why.

        Local (no communication): it reads the communicator's tuning table as
        auto does, but does not check that the ranks agree on it.

        Parameters
        ----------
        op : str
            The operation, as its method is named: ``"Allreduce"``,
            ``"Ialltoall"``, ``"Bcast_init"``, ...
        nbytes : int
            The message size auto decides by: the bytes one process
            contributes (the vector of a reduction, one block of a gather,
            scatter or all-to-all; see ``mcr.tuning``).
        device : str
            ``"cpu"`` for host memory, ``"cuda"`` for CUDA tensors.

        Returns
        -------
        mcr.tuning.Choice
            ``backend``, ``source`` (the table's file, or ``"defaults"``),
            ``entry`` (the table entry that decided, or None) and ``reason``.

        Raises
        ------
        ValueError
            For an unknown operation or device, or a negative size.
        mcr.tuning.TuningError
            If the table cannot be used (naming the file and the field).
        """
        tuning = tuning_module()
        cdef int iop = call_id(op)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes: expected a size in bytes >= 0, got {nbytes!r}")
        if device not in tuning.DEVICES:
            raise ValueError(f"device: expected one of {', '.join(tuning.DEVICES)}, "
                             f"got {device!r}")
        self.prologue(None)
        if self.chooser is None:
            self.chooser = load_chooser(self)
        cdef _Chooser ch = self.chooser
        if ch.error is not None:
            raise ch.error
        name = CALL_NAMES[iop]
        if always_mpi(iop):
            return tuning.explain(None, "fixed", name, device, nbytes, "mpi")
        backend = ch.names[ch.lookup(iop, tuning.DEVICES.index(device),
                                     min(nbytes, LLONG_MAX))]
        return tuning.explain(ch.table, ch.source, name, device, nbytes, backend)


    cdef object on_backend(self, object sub, _Call c, object backend):
        """Parse the call and run it on a backend's sub-communicator."""
        if OP_TABLE[c.op].flags & OP_MPI_ONLY:
            raise ValueError(f"{method_name(c.op, c.form)}: backend {sub.name!r} cannot run "
                             "it (one MPI datatype per process); use backend='mpi'")
        self.parse(c)
        return self.on_parsed(sub, c, backend)

    cdef object on_parsed(self, object sub, _Call c, object backend):
        """Run the parsed call on a backend's sub-communicator (its persistent
        form: a non-blocking call on `backend` at each Start)."""
        cdef Prequest preq
        if c.form == PERSISTENT:
            # what the backend cannot run must fail now, not at Start
            sub.check(c, c.args(), c.op <= CALL_RECV or c.op == CALL_BCAST)
            preq = emulated_prequest(self, partial(self._again, c, backend), c)
            if OP_TABLE[c.op].flags & OP_RECEIVES:
                preq.rtype = c.r.dtype
            return preq
        req = OP_TABLE[c.op].post_sub(sub, c)
        if detached:                    # the works of freed requests get a turn
            poll_detached()
        if c.form == NONBLOCKING:
            return pending_on(self, req)
        req.Wait(c.status)
        return None

    # -- Collectives (the public methods) ------------------------------------------

    def Barrier(self, *, backend=None):
        """Block until every process of the communicator has called it."""
        cdef int ierr
        if self.current_chain() is None and self.sub(backend) is None \
                and self.ob_mpi != MPI_COMM_NULL:
            with nogil:                   # (a barrier has nothing to parse: no call made)
                ierr = MPI_Barrier(self.ob_mpi)
            CHKERR(ierr)
            return None
        return self.call(coll_call(CALL_BARRIER, BLOCKING, backend, None, None))

    def Ibarrier(self, *, backend=None):
        """Start a barrier; return a ``Request``."""
        return self.call(coll_call(CALL_BARRIER, NONBLOCKING, backend, None, None))

    def Bcast(self, buf, root=0, *, backend=None, compress=None):
        """Broadcast `buf` from `root` to all processes.

        Parameters
        ----------
        buf : message spec
            Sent at `root`, received (must be writable) elsewhere.
        root : int
            Rank of the sending process.
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_BCAST, BLOCKING, backend, None, compress, None, buf, root))

    def Ibcast(self, buf, root=0, *, backend=None, compress=None):
        """Start a broadcast; return a ``Request``. Arguments as ``Bcast``."""
        return self.call(coll_call(CALL_BCAST, NONBLOCKING, backend, None, compress, None, buf,
                                   root))

    def Gather(self, sendbuf, recvbuf, root=0, *, backend=None, compress=None):
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
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_GATHER, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root))

    def Igather(self, sendbuf, recvbuf, root=0, *, backend=None, compress=None):
        """Start a gather; return a ``Request``. Arguments as ``Gather``."""
        return self.call(coll_call(CALL_GATHER, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root))

    def Gatherv(self, sendbuf, recvbuf, root=0, *, backend=None, compress=None):
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
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_GATHERV, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root))

    def Igatherv(self, sendbuf, recvbuf, root=0, *, backend=None, compress=None):
        """Start a vector gather; return a ``Request``. Arguments as ``Gatherv``."""
        return self.call(coll_call(CALL_GATHERV, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root))

    def Scatter(self, sendbuf, recvbuf, root=0, *, backend=None, compress=None):
        """Scatter equal blocks of `sendbuf` from `root` to all processes.

        Parameters
        ----------
        sendbuf : message spec or None
            At the root, one block per process in rank order; ignored elsewhere.
        recvbuf : message spec or IN_PLACE
            This process's block (``IN_PLACE`` at the root).
        root : int
            Rank of the scattering process.
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_SCATTER, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root))

    def Iscatter(self, sendbuf, recvbuf, root=0, *, backend=None, compress=None):
        """Start a scatter; return a ``Request``. Arguments as ``Scatter``."""
        return self.call(coll_call(CALL_SCATTER, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root))

    def Scatterv(self, sendbuf, recvbuf, root=0, *, backend=None, compress=None):
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
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_SCATTERV, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root))

    def Iscatterv(self, sendbuf, recvbuf, root=0, *, backend=None, compress=None):
        """Start a vector scatter; return a ``Request``. Arguments as ``Scatterv``."""
        return self.call(coll_call(CALL_SCATTERV, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root))

    def Allgather(self, sendbuf, recvbuf, *, backend=None, compress=None):
        """Gather equal blocks from all processes on all processes.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's block (``IN_PLACE``: already at its place in `recvbuf`).
        recvbuf : message spec
            Room for one block per process, in rank order.
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_ALLGATHER, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf))

    def Iallgather(self, sendbuf, recvbuf, *, backend=None, compress=None):
        """Start an allgather; return a ``Request``. Arguments as ``Allgather``."""
        return self.call(coll_call(CALL_ALLGATHER, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf))

    def Allgatherv(self, sendbuf, recvbuf, *, backend=None, compress=None):
        """Gather blocks of varying size on all processes.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's block.
        recvbuf : vector message spec
            ``[buf, counts, displs]``: block ``i`` lands at ``displs[i]``.
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_ALLGATHERV, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf))

    def Iallgatherv(self, sendbuf, recvbuf, *, backend=None, compress=None):
        """Start a vector allgather; return a ``Request``. Arguments as ``Allgatherv``."""
        return self.call(coll_call(CALL_ALLGATHERV, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf))

    def Alltoall(self, sendbuf, recvbuf, *, backend=None, compress=None):
        """Send block ``j`` of `sendbuf` to process ``j``, from every process.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            One equal block per destination (``IN_PLACE``: taken from `recvbuf`).
        recvbuf : message spec
            One equal block per source, in rank order.
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_ALLTOALL, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf))

    def Ialltoall(self, sendbuf, recvbuf, *, backend=None, compress=None):
        """Start an all-to-all; return a ``Request``. Arguments as ``Alltoall``."""
        return self.call(coll_call(CALL_ALLTOALL, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf))

    def Alltoallv(self, sendbuf, recvbuf, *, backend=None, compress=None):
        """All-to-all with blocks of varying size.

        Parameters
        ----------
        sendbuf : vector message spec or IN_PLACE
            ``[buf, counts, displs]``: ``counts[j]`` elements from ``displs[j]``
            go to process ``j``.
        recvbuf : vector message spec
            ``[buf, counts, displs]``: ``counts[i]`` elements from process ``i``
            land at ``displs[i]``.
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_ALLTOALLV, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf))

    def Ialltoallv(self, sendbuf, recvbuf, *, backend=None, compress=None):
        """Start a vector all-to-all; return a ``Request``. Arguments as ``Alltoallv``."""
        return self.call(coll_call(CALL_ALLTOALLV, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf))

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
            For a backend other than MPI, a block past the end of its buffer,
            or blocks that overlap (two receive blocks, or a send and a
            receive block; where each is one run of bytes).
        """
        return self.call(coll_call(CALL_ALLTOALLW, BLOCKING, backend, None, None, sendbuf,
                                   recvbuf))

    def Ialltoallw(self, sendbuf, recvbuf, *, backend=None):
        """Start an ``Alltoallw``; return a ``Request``. Arguments as ``Alltoallw``."""
        return self.call(coll_call(CALL_ALLTOALLW, NONBLOCKING, backend, None, None, sendbuf,
                                   recvbuf))

    def Reduce(self, sendbuf, recvbuf, op=SUM, root=0, *, backend=None, compress=None):
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
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_REDUCE, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root, op))

    def Ireduce(self, sendbuf, recvbuf, op=SUM, root=0, *, backend=None, compress=None):
        """Start a reduce; return a ``Request``. Arguments as ``Reduce``."""
        return self.call(coll_call(CALL_REDUCE, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, root, op))

    def Allreduce(self, sendbuf, recvbuf, op=SUM, *, backend=None, compress=None):
        """Reduce element-wise over all processes, result on all.

        Parameters
        ----------
        sendbuf : message spec or IN_PLACE
            This process's operand (``IN_PLACE``: taken from `recvbuf`).
        recvbuf : message spec
            Receives the result; same element type and count as `sendbuf`.
        op : mpi4py.MPI.Op
            The reduction, as in ``Reduce``.
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_ALLREDUCE, BLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, None, op))

    def Iallreduce(self, sendbuf, recvbuf, op=SUM, *, backend=None, compress=None):
        """Start an allreduce; return a ``Request``. Arguments as ``Allreduce``."""
        return self.call(coll_call(CALL_ALLREDUCE, NONBLOCKING, backend, None, compress, sendbuf,
                                   recvbuf, None, op))

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM, *, backend=None, compress=None):
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
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_REDUCE_SCATTER_BLOCK, BLOCKING, backend, None, compress,
                                   sendbuf, recvbuf, None, op))

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=SUM, *, backend=None,
                              compress=None):
        """Start a reduce-scatter-block; return a ``Request``. Arguments as
        ``Reduce_scatter_block``."""
        return self.call(coll_call(CALL_REDUCE_SCATTER_BLOCK, NONBLOCKING, backend, None,
                                   compress, sendbuf, recvbuf, None, op))

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM, *, backend=None,
                       compress=None):
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
        compress : str, tuple, mcr.compress.Codec, False or None
            Compression on the wire (see the ``compress`` attribute).
        """
        return self.call(coll_call(CALL_REDUCE_SCATTER, BLOCKING, backend, None, compress,
                                   sendbuf, recvbuf, None, op, recvcounts))

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=SUM, *, backend=None,
                        compress=None):
        """Start a reduce-scatter; return a ``Request``. Arguments as ``Reduce_scatter``."""
        return self.call(coll_call(CALL_REDUCE_SCATTER, NONBLOCKING, backend, None, compress,
                                   sendbuf, recvbuf, None, op, recvcounts))

    def Scan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Inclusive prefix reduction: rank ``i`` gets the reduction of ranks 0..i.

        Arguments as ``Allreduce``.
        """
        return self.call(coll_call(CALL_SCAN, BLOCKING, backend, None, None, sendbuf, recvbuf,
                                   None, op))

    def Iscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start an inclusive scan; return a ``Request``. Arguments as ``Scan``."""
        return self.call(coll_call(CALL_SCAN, NONBLOCKING, backend, None, None, sendbuf, recvbuf,
                                   None, op))

    def Exscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Exclusive prefix reduction: rank ``i`` gets the reduction of ranks
        0..i-1; `recvbuf` at rank 0 is left undefined (as in MPI).

        Arguments as ``Allreduce``.
        """
        return self.call(coll_call(CALL_EXSCAN, BLOCKING, backend, None, None, sendbuf, recvbuf,
                                   None, op))

    def Iexscan(self, sendbuf, recvbuf, op=SUM, *, backend=None):
        """Start an exclusive scan; return a ``Request``. Arguments as ``Exscan``."""
        return self.call(coll_call(CALL_EXSCAN, NONBLOCKING, backend, None, None, sendbuf,
                                   recvbuf, None, op))

    # -- Persistent point-to-point and collectives --------------------------------

    def Send_init(self, buf, dest, tag=0, *, backend=None):
        """Create a persistent send; return an inactive ``Prequest``.

        Arguments as ``Send``; each ``Start`` sends what `buf` holds then.
        """
        return self.call(send_call(CALL_SEND, PERSISTENT, backend, buf, dest, tag))

    def Recv_init(self, buf, source=ANY_SOURCE, tag=ANY_TAG, *, backend=None):
        """Create a persistent receive; return an inactive ``Prequest``.

        Arguments as ``Recv``; each ``Start`` receives into `buf` again.
        """
        return self.call(recv_call(PERSISTENT, backend, buf, source, tag, None))

    def Bsend_init(self, buf, dest, tag=0, *, backend=None):
        """Create a persistent buffered send; return an inactive ``Prequest``.

        Arguments as ``Bsend``; each ``Start`` sends what `buf` holds then.
        """
        return self.call(send_call(CALL_BSEND, PERSISTENT, backend, buf, dest, tag))

    def Ssend_init(self, buf, dest, tag=0, *, backend=None):
        """Create a persistent synchronous send; return an inactive ``Prequest``.

        Arguments as ``Ssend``; each ``Start`` sends what `buf` holds then.
        """
        return self.call(send_call(CALL_SSEND, PERSISTENT, backend, buf, dest, tag))

    def Rsend_init(self, buf, dest, tag=0, *, backend=None):
        """Create a persistent ready send; return an inactive ``Prequest``.

        Arguments as ``Rsend``; each ``Start`` sends what `buf` holds then.
        """
        return self.call(send_call(CALL_RSEND, PERSISTENT, backend, buf, dest, tag))

    def Barrier_init(self, info=None, *, backend=None):
        """Persistent ``Barrier``; arguments as ``Barrier``, plus `info`."""
        return self.call(coll_call(CALL_BARRIER, PERSISTENT, backend, info, None))

    def Bcast_init(self, buf, root=0, info=None, *, backend=None, compress=None):
        """Persistent ``Bcast``; arguments as ``Bcast``, plus `info`."""
        return self.call(coll_call(CALL_BCAST, PERSISTENT, backend, info, compress, None, buf,
                                   root))

    def Gather_init(self, sendbuf, recvbuf, root=0, info=None, *, backend=None,
                    compress=None):
        """Persistent ``Gather``; arguments as ``Gather``, plus `info`."""
        return self.call(coll_call(CALL_GATHER, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf, root))

    def Gatherv_init(self, sendbuf, recvbuf, root=0, info=None, *, backend=None,
                     compress=None):
        """Persistent ``Gatherv``; arguments as ``Gatherv``, plus `info`."""
        return self.call(coll_call(CALL_GATHERV, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf, root))

    def Scatter_init(self, sendbuf, recvbuf, root=0, info=None, *, backend=None,
                     compress=None):
        """Persistent ``Scatter``; arguments as ``Scatter``, plus `info`."""
        return self.call(coll_call(CALL_SCATTER, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf, root))

    def Scatterv_init(self, sendbuf, recvbuf, root=0, info=None, *, backend=None,
                      compress=None):
        """Persistent ``Scatterv``; arguments as ``Scatterv``, plus `info`."""
        return self.call(coll_call(CALL_SCATTERV, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf, root))

    def Allgather_init(self, sendbuf, recvbuf, info=None, *, backend=None, compress=None):
        """Persistent ``Allgather``; arguments as ``Allgather``, plus `info`."""
        return self.call(coll_call(CALL_ALLGATHER, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf))

    def Allgatherv_init(self, sendbuf, recvbuf, info=None, *, backend=None, compress=None):
        """Persistent ``Allgatherv``; arguments as ``Allgatherv``, plus `info`."""
        return self.call(coll_call(CALL_ALLGATHERV, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf))

    def Alltoall_init(self, sendbuf, recvbuf, info=None, *, backend=None, compress=None):
        """Persistent ``Alltoall``; arguments as ``Alltoall``, plus `info`."""
        return self.call(coll_call(CALL_ALLTOALL, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf))

    def Alltoallv_init(self, sendbuf, recvbuf, info=None, *, backend=None, compress=None):
        """Persistent ``Alltoallv``; arguments as ``Alltoallv``, plus `info`."""
        return self.call(coll_call(CALL_ALLTOALLV, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf))

    def Alltoallw_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Persistent ``Alltoallw``; arguments as ``Alltoallw``, plus `info`."""
        return self.call(coll_call(CALL_ALLTOALLW, PERSISTENT, backend, info, None, sendbuf,
                                   recvbuf))

    def Reduce_init(self, sendbuf, recvbuf, op=SUM, root=0, info=None, *, backend=None,
                    compress=None):
        """Persistent ``Reduce``; arguments as ``Reduce``, plus `info`."""
        return self.call(coll_call(CALL_REDUCE, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf, root, op))

    def Allreduce_init(self, sendbuf, recvbuf, op=SUM, info=None, *, backend=None, compress=None):
        """Persistent ``Allreduce``; arguments as ``Allreduce``, plus `info`."""
        return self.call(coll_call(CALL_ALLREDUCE, PERSISTENT, backend, info, compress, sendbuf,
                                   recvbuf, None, op))

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=SUM, info=None, *, backend=None,
                                  compress=None):
        """Persistent ``Reduce_scatter_block``; arguments as ``Reduce_scatter_block``,
        plus `info`."""
        return self.call(coll_call(CALL_REDUCE_SCATTER_BLOCK, PERSISTENT, backend, info, compress,
                                   sendbuf, recvbuf, None, op))

    def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=SUM, info=None, *,
                            backend=None, compress=None):
        """Persistent ``Reduce_scatter``; arguments as ``Reduce_scatter``, plus `info`."""
        return self.call(coll_call(CALL_REDUCE_SCATTER, PERSISTENT, backend, info, compress,
                                   sendbuf, recvbuf, None, op, recvcounts))

    def Scan_init(self, sendbuf, recvbuf, op=SUM, info=None, *, backend=None):
        """Persistent ``Scan``; arguments as ``Scan``, plus `info`."""
        return self.call(coll_call(CALL_SCAN, PERSISTENT, backend, info, None, sendbuf, recvbuf,
                                   None, op))

    def Exscan_init(self, sendbuf, recvbuf, op=SUM, info=None, *, backend=None):
        """Persistent ``Exscan``; arguments as ``Exscan``, plus `info`."""
        return self.call(coll_call(CALL_EXSCAN, PERSISTENT, backend, info, None, sendbuf, recvbuf,
                                   None, op))

# The calls of the buffer methods, by the shape of their arguments (the
# fields a descriptor's parse reads); inline, as each public method makes one.

cdef inline _Call send_call(int op, int form, object backend, object buf, object dest,
                            object tag):
    cdef _Call c = new_call()
    c.op, c.form, c.sendbuf, c.dest, c.tag = op, form, buf, dest, tag
    if backend is not None:           # (a new call's fields are None)
        c.backend = backend
    return c


cdef inline _Call recv_call(int form, object backend, object buf, object source, object tag,
                            object status):
    cdef _Call c = new_call()
    c.op, c.form, c.recvbuf, c.source, c.tag = CALL_RECV, form, buf, source, tag
    if backend is not None:           # (a new call's fields are None)
        c.backend = backend
    if status is not None:
        c.status = status
    return c


cdef inline _Call sendrecv_call(int form, object backend, object sendbuf, object dest,
                                object sendtag, object recvbuf, object source, object recvtag,
                                object status):
    cdef _Call c = new_call()
    c.op, c.form, c.backend = CALL_SENDRECV, form, backend
    c.sendbuf, c.dest, c.tag = sendbuf, dest, sendtag
    c.recvbuf, c.source, c.recvtag, c.status = recvbuf, source, recvtag, status
    return c


cdef inline _Call replace_call(int form, object backend, object buf, object dest,
                               object sendtag, object source, object recvtag, object status):
    cdef _Call c = sendrecv_call(form, backend, None, dest, sendtag, buf, source, recvtag,
                                 status)
    c.op = CALL_SENDRECV_REPLACE
    return c


cdef inline _Call coll_call(int op, int form, object backend, object info, object compress,
                            object sendbuf=None, object recvbuf=None, object root=None,
                            object redop=None, object recvcounts=None):
    """A collective's call: `compress` is its ``compress`` argument (None:
    the communicator's default); Bcast's `buf` is `recvbuf`."""
    cdef _Call c = new_call()
    c.op, c.form = op, form
    c.sendbuf, c.recvbuf, c.root, c.redop = sendbuf, recvbuf, root, redop
    # (a new call's fields are None: the rare ones are set only when given)
    if backend is not None or info is not None or compress is not None or recvcounts is not None:
        c.backend, c.info, c.compress, c.recvcounts = backend, info, compress, recvcounts
    return c


cdef object _newobj = __import__("copyreg").__newobj__
cdef object operator_index = __import__("operator").index


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
