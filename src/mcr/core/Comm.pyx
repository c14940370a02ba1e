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
    name = os.environ.get("MCR_BACKEND") or None
    if name is not None:
        try:
            check_backend(name)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"MCR_BACKEND: {exc}") from None
    return None if name == "mpi" else AUTO_NAME if name == "auto" else name


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
    cdef _Chooser chooser          # what auto decides here (auto.pxi), at first use
    cdef object compress_dflt      # the compression default (a spec), or None
    cdef bint unlogged             # mcr's private communicator: the logger skips it
    cdef _Watch watch              # checked mode, timeout, records (checkimpl.pxi), or None
    cdef object meeting            # a constructor's barrier that timed out (meet), or None
    cdef object nbplan             # a topology's neighbourhood rounds (neighbor.pxi), or None
    cdef Py_ssize_t pending        # requests posted here not yet seen to complete (settle)
    cdef MPI_Comm deferred         # freed by Free while some were pending: freed at the last
    cdef unsigned long epoch       # the chain_epoch its chains were built at (chain.pxi)
    cdef tuple chain               # the interceptors its calls run through; None: none
    cdef tuple zchain              # ... and compression, for a call that passes compress

    def __cinit__(self, *args, **kwargs):
        self.deferred = MPI_COMM_NULL
        self.dflt = ENV_BACKEND
        if ENV_CHECK or ENV_TIMEOUT > 0:
            self.set_watch(ENV_CHECK, ENV_TIMEOUT)

    def __dealloc__(self):
        global watched_comms
        if self.watch is not None:
            watched_comms -= 1

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
        self.dflt = None if value == "mpi" else AUTO_NAME if value == "auto" else value

    @property
    def compress(self):
        """The compression of the calls that can be compressed (Allreduce,
        Reduce, Reduce_scatter(_block), Allgather(v), Gather(v), Scatter(v),
        Bcast, Alltoall(v) on float32/float64 tensors) when they pass no ``compress``: None
        (none), ``"fp16"``, ``"bf16"``, ``"zfp:rate=R"``, ``(encode,
        decode)`` or a ``mcr.compress.Codec``; settable. Calls it cannot
        serve (other element types, a reduction's op other than SUM, MAX,
        MIN) run uncompressed. Communicators made
        from this one (``Dup``, ``Split``, ...) start with the same.

        A call's own ``compress`` argument takes precedence: a spec as above
        (raising ``TypeError`` or ``ValueError`` naming ``compress`` for a
        call it cannot serve, before any process communicates), None for
        this default, False for none."""
        return self.compress_dflt

    @compress.setter
    def compress(self, value):
        if value is not None and value is not False:
            compress_module().codec(value)      # a bad spec fails here, not at a call
        self.set_compress(None if value is False else value)

    cdef int set_compress(self, object value) except -1:
        self.compress_dflt = value
        self.epoch = 0                # its chain: with compression or without
        return 0

    @property
    def checked(self):
        """Checked mode: before each collective (and each constructor,
        ``Dup``, ``Split``, ...) the processes agree on what
        they call (operation, backend, root, element type, counts, reduction
        op, sequence number), and all raise ``mcr.MismatchError`` when they
        differ, or when one of them refused its arguments, before any of them
        communicates. Settable (on every process of the communicator alike);
        initially ``$MCR_CHECK``. Communicators made from this one start with
        the same."""
        return self.watch is not None and self.watch.checked

    @checked.setter
    def checked(self, value):
        self.set_watch(bool(value), self.watch.timeout if self.watch is not None else 0.0)

    @property
    def timeout(self):
        """Seconds a wait on this communicator's calls may last before it
        raises ``mcr.TimeoutError`` naming this process's pending calls
        (blocking calls included), or None; settable, initially
        ``$MCR_TIMEOUT``. Communicators made from this one start with the same.
        Waits then poll, which costs latency on long waits (see the
        "Debugging hangs" page)."""
        if self.watch is None or self.watch.timeout == 0:
            return None
        return self.watch.timeout

    @timeout.setter
    def timeout(self, value):
        self.set_watch(self.watch is not None and self.watch.checked, as_timeout(value))

    cdef int set_watch(self, bint checked, double timeout) except -1:
        global watched_comms
        if self.watch is None:
            self.watch = _Watch.__new__(_Watch)
            watched_comms += 1
        self.watch.checked = checked
        self.watch.timeout = timeout
        self.epoch = 0                # its chain: watched or not
        return 0

    cdef _Watch recorded_watch(self):
        """The watch of a communicator whose calls the flight recorder records."""
        if self.watch is None:
            self.set_watch(False, 0.0)
        return self.watch

    def __repr__(self):
        if self.ob_mpi == MPI_COMM_NULL:
            return "<mcr.Comm null>"
        return f"<mcr.Comm rank {self.Get_rank()} of {self.Get_size()}>"

    def to_mpi4py(self):
        """Return an ``mpi4py.MPI.Intracomm`` sharing this communicator."""
        return _mpi4py.Intracomm(self)

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
        if staged_on:
            with staged_window():
                with nogil:
                    ierr = MPI_Probe(isource, itag, self.ob_mpi, sp)
        else:
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
        cdef object sub = self.sub(c.backend)
        if self.epoch != chain_epoch:
            self.rebuild_chain()
        if self.chain is None and c.compress is None:
            if sub is None:
                return self.on_mpi(c, False)
            if sub is AUTO_SUB:
                return self.on_auto(c)
            return self.on_backend(sub, c, c.backend)
        c.sub = sub
        c.chain = self.chain if c.compress is None else self.zchain
        return proceed(self, c, 0)

    cdef int parse(self, _Call c) except -1:
        """Check and parse the call's arguments, once."""
        if not c.parsed:
            OP_TABLE[c.op].parse(self, c)
            c.parsed = True
        return 0

    cdef int rebuild_chain(self) except -1:
        """The interceptors its calls run through, as the settings are now."""
        self.chain = build_chain(self, None)
        self.zchain = build_chain(self, COMPRESSION)
        self.epoch = chain_epoch
        return 0

    cdef object post_call(self, _Call c):
        """The end of the chain: post the call on its backend."""
        if c.op == COMM_OP:
            return c.make(self, *c.makeargs)
        if c.op == COMM_P2P_OP:
            a, b, d, e, f, g, h = c.makeargs + (None,) * (7 - len(c.makeargs))
            return obj_p2p_plain(self, c.p2p, a, b, d, e, f, g, h)
        if c.op >= CALL_COUNT:
            return nb_run(self, c.op - CALL_COUNT, c.form, c.sendbuf, c.recvbuf, c.backend,
                          c.info)
        if c.sub is None:
            return self.on_mpi(c, False)
        if c.sub is AUTO_SUB:
            return self.on_auto(c)
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
        req.owner = self
        self.pending += 1
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
        cdef Prequest preq = Prequest.__new__(Prequest)
        preq.comm = self
        # persistent point-to-point is MPI-1; persistent collectives may be emulated
        cdef bint emulated = c.op > CALL_RECV and preq.emulated()
        self.parse(c)
        if choose and self.chosen_other(c):
            return self.on_chosen(c)
        if c.op == CALL_RECV and c.isource == MPI_PROC_NULL and library_is_mpich():
            emulated = True       # MPICH's status of one says ANY_SOURCE: an Irecv at each start
        if c.op == CALL_ALLTOALLW and self.nprocs() == 1:
            emulated = True       # one process: the block moves at each start (mpi_alltoallw)
        preq.keep = c
        if OP_TABLE[c.op].flags & OP_RECEIVES:
            preq.rtype = c.r.dtype
        if emulated:              # (auto chose MPI: each Start runs on MPI)
            preq.start_fn = partial(self._again, c, "mpi" if choose else c.backend)
        else:
            self.post_mpi(c, PERSISTENT, info, &preq.ob_mpi)
            preq.ob_buf = c       # staged device buffers are copied at each start
            preq.logop = c.op + 1
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
            preq = Prequest.__new__(Prequest)
            preq.comm = self
            preq.foreign = True
            preq.keep = c
            if OP_TABLE[c.op].flags & OP_RECEIVES:
                preq.rtype = c.r.dtype
            preq.start_fn = partial(self._again, c, backend)
            return preq
        req = OP_TABLE[c.op].post_sub(sub, c)
        if c.form == NONBLOCKING:
            if isinstance(req, Request) and (<Request>req).owner is None:
                (<Request>req).owner = self
                self.pending += 1
            return req
        req.Wait(c.status)
        return None

    # -- Collectives (the public methods) ------------------------------------------

    def Barrier(self, *, backend=None):
        """Block until every process of the communicator has called it."""
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
            For a backend other than MPI, or a block past the end of its buffer.
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

    # -- mpi4py's collectives on pickled objects ------------------------------------
    #
    # mpi4py's own methods (pickle, then MPI's blocking calls). On a watched
    # communicator (checked, a timeout, the flight recorder) each takes its
    # number among the collectives and a record, and meets the other processes
    # first (`made`): a process that skips one is then a TimeoutError or a
    # MismatchError, not a hang inside MPI.

    def barrier(self):
        """Barrier synchronization, as ``Barrier`` (mpi4py's method)."""
        return self.made("barrier", _obj_barrier, ())

    def bcast(self, obj, int root=0):
        """Broadcast a Python object from `root` (mpi4py's method, pickled)."""
        return self.made("bcast", _obj_bcast, (obj, root), root)

    def gather(self, sendobj, int root=0):
        """Gather Python objects at `root` (mpi4py's method, pickled)."""
        return self.made("gather", _obj_gather, (sendobj, root), root)

    def scatter(self, sendobj, int root=0):
        """Scatter Python objects from `root` (mpi4py's method, pickled)."""
        return self.made("scatter", _obj_scatter, (sendobj, root), root)

    def allgather(self, sendobj):
        """Gather Python objects on every process (mpi4py's method, pickled)."""
        return self.made("allgather", _obj_allgather, (sendobj,))

    def alltoall(self, sendobj):
        """Exchange Python objects, one to each process (mpi4py's method,
        pickled)."""
        return self.made("alltoall", _obj_alltoall, (sendobj,))

    def reduce(self, sendobj, op=SUM, int root=0):
        """Reduce Python objects to `root` (mpi4py's method, pickled)."""
        return self.made("reduce", _obj_reduce, (sendobj, op, root), root)

    def allreduce(self, sendobj, op=SUM):
        """Reduce Python objects on every process (mpi4py's method, pickled)."""
        return self.made("allreduce", _obj_allreduce, (sendobj, op))

    def scan(self, sendobj, op=SUM):
        """Inclusive prefix reduction of Python objects (mpi4py's method,
        pickled)."""
        return self.made("scan", _obj_scan, (sendobj, op))

    def exscan(self, sendobj, op=SUM):
        """Exclusive prefix reduction of Python objects (mpi4py's method,
        pickled)."""
        return self.made("exscan", _obj_exscan, (sendobj, op))

    # -- mpi4py's point-to-point on pickled objects ---------------------------------
    #
    # mpi4py's own methods. With a timeout or the flight recorder each gets a
    # record; with a timeout the blocking ones run polled (obj_p2p): a send as
    # its non-blocking form and a timed wait, a receive or probe as a matched
    # probe tested until a message comes, so that a process whose peer never
    # sends or receives gets a TimeoutError, not a hang inside MPI. The
    # non-blocking ones (isend, issend, irecv) return an mcr Request then,
    # with the timeout and the record. (bsend, ibsend: buffered, not watched.)

    def send(self, obj, dest, tag=0):
        """Send a Python object (mpi4py's method, pickled)."""
        return self.pickled_p2p(P2P_SEND, (obj, dest, tag))

    def ssend(self, obj, dest, tag=0):
        """Send a Python object in synchronous mode (mpi4py's method, pickled)."""
        return self.pickled_p2p(P2P_SSEND, (obj, dest, tag))

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Receive a Python object (mpi4py's method, pickled)."""
        return self.pickled_p2p(P2P_RECV, (buf, source, tag, status))

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        """Send a Python object and receive one (mpi4py's method, pickled)."""
        return self.pickled_p2p(P2P_SENDRECV, (sendobj, dest, sendtag, recvbuf, source,
                                               recvtag, status))

    def isend(self, obj, dest, tag=0):
        """Start sending a Python object (mpi4py's method, pickled): a
        request (an ``mcr.Request`` on a watched communicator)."""
        return self.pickled_p2p(P2P_ISEND, (obj, dest, tag))

    def issend(self, obj, dest, tag=0):
        """Start sending a Python object in synchronous mode (mpi4py's
        method, pickled)."""
        return self.pickled_p2p(P2P_ISSEND, (obj, dest, tag))

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        """Start receiving a Python object (mpi4py's method, pickled):
        ``wait()`` returns it."""
        return self.pickled_p2p(P2P_IRECV, (buf, source, tag))

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Wait for a message, without receiving it (mpi4py's method)."""
        return self.pickled_p2p(P2P_PROBE, (None, source, tag, status))

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Wait for a message and match it, as an ``mpi4py.MPI.Message``
        (mpi4py's method)."""
        return self.pickled_p2p(P2P_MPROBE, (None, source, tag, status))

    # -- Communicator management -------------------------------------------------

    def Free(self):
        """Free the communicator (collective over its processes).

        Freeing a null communicator (already freed, or from ``Split`` with
        ``UNDEFINED``) does nothing, so ``Free`` is idempotent; afterwards every
        operation on this object raises ``ValueError``. Other Python objects
        that share the handle (``comm.to_mpi4py()``, ``mcr.Comm(comm)``) must
        not be used after it either.

        Operations still pending complete normally, as MPI says: their
        requests may be waited for or tested afterwards, and MPI frees the
        communicator when the last of them completes. A Fusion's open
        buckets on it are posted first. (Operations posted through another
        object sharing the handle are not counted.)

        Raises
        ------
        mcr.Exception
            For ``COMM_WORLD`` and ``COMM_SELF``, which MPI does not free
            (error class ``MPI.ERR_COMM``, as mpi4py raises).
        mcr.TimeoutError
            At the communicator's timeout, when it has a Gloo or NCCL
            sub-communicator and another process has not called ``Free``
            (it is not freed then; calling ``Free`` again waits again).
        mcr.MismatchError
            In checked mode, when another process makes another call of the
            communicator instead (it is not freed then).
        """
        if self.ob_mpi == MPI_COMM_NULL:
            return None
        if self.ob_mpi == MPI_COMM_WORLD or self.ob_mpi == MPI_COMM_SELF:
            # MPI_Comm_free would report it through the communicator's error
            # handler, which may be ERRORS_ARE_FATAL: raise MPI's error here
            raise Exception(MPI_ERR_COMM)
        if staged_on:
            before_collective(self)     # a Fusion's open buckets are posted first
        p = meet(self, "Free")
        if _backends is not None:
            try:
                _backends.release(self)   # the Gloo/NCCL sub-communicators first
            except BaseException:
                if p is not None:
                    pend_end(<_Pend>p, PEND_FAILED)
                if self.watch is not None and not self.unlogged:   # (meet numbered it)
                    # its barrier stays posted: Free made again waits for it, as this number
                    self.watch.seq -= 1
                raise
        if self.watch is not None:
            self.watch.free_priv()
        cdef int ierr = MPI_SUCCESS
        if self.pending > 0:
            # MPI: pending operations complete normally. Open MPI would free
            # a pending collective's schedule with the communicator, so MPI
            # frees it when the last of them completes (settle, Request.pyx)
            self.deferred, self.ob_mpi = self.ob_mpi, MPI_COMM_NULL
        else:
            with nogil:
                ierr = MPI_Comm_free(&self.ob_mpi)
        if p is not None:
            pend_end(<_Pend>p, PEND_DONE if ierr == MPI_SUCCESS else PEND_FAILED)
        CHKERR(ierr)

    def Dup(self, info=None):
        """Duplicate the communicator: same processes, new context; the copy
        has the same class and default ``backend``, and its own backend
        sub-communicators (made at its first call on each backend)."""
        return self.inherit(self.made("Dup", _MPI.Intracomm.Dup,
                                      () if info is None else (info,)))

    def Clone(self):
        """Duplicate the communicator, as ``Dup`` without hints."""
        return self.inherit(self.made("Clone", _MPI.Intracomm.Clone, ()))

    def Dup_with_info(self, info):
        """Duplicate the communicator with the hints `info`, as ``Dup``."""
        return self.inherit(self.made("Dup_with_info", _MPI.Intracomm.Dup_with_info, (info,)))

    def Idup(self, info=None):
        """Start duplicating the communicator: ``(comm, request)``. `comm`
        has this communicator's settings, as with ``Dup``, and may be used
        once `request` is complete.

        It does not wait at the call, even with a timeout (it is
        non-blocking); checked mode matches it at the call, as the other
        constructors. With a timeout or the flight recorder, `request` is an
        ``mcr.Request`` whose waits time out and whose record says when it
        completed; else mpi4py's."""
        return self.started("Idup", _MPI.Intracomm.Idup, (info,))

    def Idup_with_info(self, info):
        """Start duplicating the communicator with the hints `info`, as ``Idup``."""
        return self.started("Idup_with_info", _MPI.Intracomm.Idup_with_info, (info,))

    cdef tuple started(self, str call, object make, tuple args):
        """mpi4py's non-blocking constructor `make(self, *args)` (`call`,
        such as "Idup"), through the chain: the communicator and the request
        (watched, an mcr Request carrying the call's record and the timeout)."""
        comm, request = self.comm_call(COMM_STARTED, NONBLOCKING, call, make, args, -1,
                                       False)
        return self.inherit(comm), request

    cdef object posted(self, str call, object make, tuple args):
        """mpi4py's non-blocking collective `make(self, *args)` (`call`, such
        as "Ineighbor_alltoall", inside a call on the chain), returning its
        request: as `started`."""
        return self.comm_call(COMM_POSTED, NONBLOCKING, call, make, args, -1, True)

    cdef object watched_request(self, object p, object request):
        """The request of a non-blocking call that `meet` recorded as `p`
        (None: not watched, mpi4py's request as it is): an mcr Request with
        the record and the communicator's timeout."""
        if p is None:
            return request
        (<_Pend>p).form = NONBLOCKING
        cdef Request req
        if isinstance(request, Request):         # mcr's own (a composed call)
            req = <Request>request
            req.timeout, req.pend = self.watch.timeout, p
            return req
        return as_mcr_request(request, self.watch.timeout, <_Pend>p)

    cdef object made(self, str call, object make, tuple args, int root=-1, bint inner=False):
        """mpi4py's method `make(self, *args)` for a collective call outside
        the buffer methods (`call`, such as "Dup" or "bcast"; `root`, or -1),
        through the chain (a Fusion's buckets posted first, the watch's
        number and record, the staged window); `inner`: made by a call on the
        chain already (a neighbourhood collective's)."""
        return self.comm_call(COMM_MADE, BLOCKING, call, make, args, root, inner)

    cdef object pickled_p2p(self, int p2p, tuple args):
        """mpi4py's point-to-point method `p2p` on pickled objects (one of
        OBJ_P2P_NAMES; its arguments, in order), through the chain (with a
        timeout or the recorder: obj_p2p, checkimpl.pxi)."""
        cdef bint posted = p2p >= P2P_ISEND
        return self.comm_call(COMM_P2P_POSTED if posted else COMM_P2P,
                              NONBLOCKING if posted else BLOCKING, OBJ_P2P_NAMES[p2p], None,
                              args, -1, False, p2p)

    cdef object comm_call(self, int kind, int form, str name, object make, tuple args,
                          int root, bint inner, int p2p=0):
        """A call outside the buffer methods, as a _Call on the chain (none:
        mpi4py's function at once)."""
        if self.epoch != chain_epoch:
            self.rebuild_chain()
        cdef _Call c = _Call.__new__(_Call)
        c.op = COMM_P2P_OP if kind >= COMM_P2P else COMM_OP
        c.form, c.kind, c.p2p, c.callname, c.make, c.makeargs = form, kind, p2p, name, make, args
        c.iroot, c.inner, c.name = root, inner, "mpi"
        if self.chain is None:
            return self.post_call(c)
        c.chain = self.chain
        return proceed(self, c, 0)

    cdef object inherit(self, object comm):
        # mpi4py's Dup and Clone make an object of type(self): a user's
        # subclass stays one, as with mpi4py
        (<Comm>comm).dflt = self.dflt
        if self.compress_dflt is not None:
            (<Comm>comm).set_compress(self.compress_dflt)
        if self.watch is not None:
            (<Comm>comm).set_watch(self.watch.checked, self.watch.timeout)
        return comm

    cdef Comm derived(self, _MPI.Comm comm):
        cdef Comm out = as_comm(comm)
        out.dflt = self.dflt
        if self.compress_dflt is not None:
            out.set_compress(self.compress_dflt)
        if self.watch is not None:
            out.set_watch(self.watch.checked, self.watch.timeout)
        return out

    def Split(self, int color=0, int key=0):
        """Split into disjoint communicators by `color`, ordered by `key`.

        Returns an ``mcr.Comm``; with ``color=UNDEFINED`` a null one (as
        mpi4py's ``COMM_NULL``), on which every operation raises ``ValueError``.
        """
        return self.derived(self.made("Split", _MPI.Intracomm.Split, (color, key)))

    def Split_type(self, int split_type, int key=0, info=None):
        """Split by a type such as ``COMM_TYPE_SHARED`` (processes sharing memory),
        ordered by `key`; returns an ``mcr.Comm`` (null for ``UNDEFINED``)."""
        return self.derived(self.made("Split_type", _MPI.Intracomm.Split_type,
                                      (split_type, key) if info is None else
                                      (split_type, key, info)))

    def Create(self, group):
        """Create a communicator from a group (collective); see mpi4py."""
        return self.derived(self.made("Create", _MPI.Intracomm.Create, (group,)))

    def Create_group(self, group, int tag=0):
        """Create a communicator from a group (collective over the group); see mpi4py."""
        return self.derived(_MPI.Intracomm.Create_group(self, group, tag))

    # -- Topologies --------------------------------------------------------------------
    # MPI's calls, through mpi4py's methods; the result is mcr's class of the
    # topology (Cartcomm, ...), a Comm with mpi4py's topology methods

    def Create_cart(self, dims, periods=None, bint reorder=False):
        """Create a communicator with a Cartesian topology (collective): an
        ``mcr.Cartcomm`` with this communicator's settings (backend, checked
        mode, timeout); null on the processes left out of the grid. See
        mpi4py.

        Raises
        ------
        ValueError
            If a dimension is negative or zero, or the grid has more points
            than the communicator has processes (before any communication).
        """
        cdef object points = 1
        try:
            sizes = [operator_index(d) for d in dims]
        except TypeError:
            raise TypeError(f"dims: expected a sequence of integers, got "
                            f"{type(dims).__name__}") from None
        for i, d in enumerate(sizes):
            if d <= 0:
                raise ValueError(f"dims: dimension {i} is {d}; each must be at least 1")
            points *= d
        if points > self.Get_size():
            raise ValueError(f"dims: a grid of {' x '.join(map(str, sizes))} = {points} "
                             f"processes on a communicator of {self.Get_size()}")
        return self.topology(self.made("Create_cart", _MPI.Intracomm.Create_cart,
                                       (sizes, periods, reorder)))

    def Create_graph(self, index, edges, bint reorder=False):
        """Create a communicator with a graph topology (collective): an
        ``mcr.Graphcomm`` with this communicator's settings; see mpi4py."""
        return self.topology(self.made("Create_graph", _MPI.Intracomm.Create_graph,
                                       (index, edges, reorder)))

    def Create_dist_graph_adjacent(self, sources, destinations, sourceweights=None,
                                   destweights=None, info=None, bint reorder=False):
        """Create a communicator with a distributed graph topology from each
        process's neighbours (collective): an ``mcr.Distgraphcomm`` with this
        communicator's settings; see mpi4py."""
        return self.topology(self.made(
            "Create_dist_graph_adjacent", _MPI.Intracomm.Create_dist_graph_adjacent,
            (sources, destinations, sourceweights, destweights,
             _mpi4py.INFO_NULL if info is None else info, reorder)))

    def Create_dist_graph(self, sources, degrees, destinations, weights=None, info=None,
                          bint reorder=False):
        """Create a communicator with a distributed graph topology from any
        edges (collective): an ``mcr.Distgraphcomm`` with this communicator's
        settings; see mpi4py."""
        return self.topology(self.made(
            "Create_dist_graph", _MPI.Intracomm.Create_dist_graph,
            (sources, degrees, destinations, weights,
             _mpi4py.INFO_NULL if info is None else info, reorder)))

    cdef object topology(self, _MPI.Comm comm):
        """`comm` (mpi4py's topology communicator) as mcr's class of its
        topology, with this communicator's settings."""
        cls = TOPOLOGY_CLASSES[type(comm)]
        cdef Comm out = <Comm>cls.__new__(cls)
        out.ob_mpi = comm.ob_mpi
        if cls is Distgraphcomm and out.ob_mpi != MPI_COMM_NULL \
                and _MPI.Comm.Get_topology(out) == _mpi4py.DIST_GRAPH:
            # its neighborhood collectives' rounds (neighbor.pxi). (Open MPI 5.0
            # gives a distributed graph made from a Cartesian communicator the
            # Cartesian topology: Get_topology says CART.)
            nb_agreed(out)
        return self.inherit(out)

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


class _Neighborhood:
    """The neighborhood collectives of mcr's topologies (neighbor.pxi): on
    MPI, mpi4py's methods move the data (CUDA tensors staged through host
    copies); on another backend, they are composed of its Alltoallv. Checked
    mode, timeouts and the flight recorder see the blocking and non-blocking
    forms (`Comm.made`, `Comm.posted`)."""

    __slots__ = ()

    def Neighbor_allgather(self, sendbuf, recvbuf, *, backend=None):
        """Gather a block from every neighbour (collective).

        Parameters
        ----------
        sendbuf : message spec
            The block every neighbour receives.
        recvbuf : message spec
            One block per source neighbour, in the topology's order.
        backend : str or None
            ``"mpi"`` (mpi4py's method), another backend (composed of its
            ``Alltoallv``), ``"auto"`` (MPI) or None (the default).
        """
        return neighbor(<Comm>self, NB_ALLGATHER, BLOCKING, sendbuf, recvbuf, backend, None)

    def Neighbor_allgatherv(self, sendbuf, recvbuf, *, backend=None):
        """Gather blocks of any size from every neighbour (collective).

        Parameters
        ----------
        sendbuf : message spec
            The block every neighbour receives.
        recvbuf : vector message spec
            ``[buf, counts, displs]``: ``counts[i]`` elements from the
            ``i``-th source neighbour land at ``displs[i]``.
        backend : str or None
            ``"mpi"`` (mpi4py's method), another backend (composed of its
            ``Alltoallv``), ``"auto"`` (MPI) or None (the default).
        """
        return neighbor(<Comm>self, NB_ALLGATHERV, BLOCKING, sendbuf, recvbuf, backend, None)

    def Neighbor_alltoall(self, sendbuf, recvbuf, *, backend=None):
        """Exchange one block with every neighbour (collective).

        Parameters
        ----------
        sendbuf : message spec
            One block per destination neighbour, in the topology's order.
        recvbuf : message spec
            One block per source neighbour.
        backend : str or None
            ``"mpi"`` (mpi4py's method), another backend (composed of its
            ``Alltoallv``), ``"auto"`` (MPI) or None (the default).
        """
        return neighbor(<Comm>self, NB_ALLTOALL, BLOCKING, sendbuf, recvbuf, backend, None)

    def Neighbor_alltoallv(self, sendbuf, recvbuf, *, backend=None):
        """Exchange blocks of any size with every neighbour (collective).

        Parameters
        ----------
        sendbuf : vector message spec
            ``[buf, counts, displs]``, a block per destination neighbour.
        recvbuf : vector message spec
            ``[buf, counts, displs]``, a block per source neighbour.
        backend : str or None
            ``"mpi"`` (mpi4py's method), another backend (composed of its
            ``Alltoallv``), ``"auto"`` (MPI) or None (the default).
        """
        return neighbor(<Comm>self, NB_ALLTOALLV, BLOCKING, sendbuf, recvbuf, backend, None)

    def Neighbor_alltoallw(self, sendbuf, recvbuf, *, backend=None):
        """Exchange blocks of any datatype with every neighbour (collective; backend MPI only).

        Parameters
        ----------
        sendbuf : [buf, counts, displs, datatypes]
            As mpi4py's, a block per destination neighbour.
        recvbuf : [buf, counts, displs, datatypes]
            A block per source neighbour.
        backend : str or None
            ``"mpi"`` (mpi4py's method), another backend (composed of its
            ``Alltoallv``), ``"auto"`` (MPI) or None (the default).
        """
        return neighbor(<Comm>self, NB_ALLTOALLW, BLOCKING, sendbuf, recvbuf, backend, None)

    def Ineighbor_allgather(self, sendbuf, recvbuf, *, backend=None):
        """Start ``Neighbor_allgather``; return its ``Request``."""
        return neighbor(<Comm>self, NB_ALLGATHER, NONBLOCKING, sendbuf, recvbuf, backend, None)

    def Ineighbor_allgatherv(self, sendbuf, recvbuf, *, backend=None):
        """Start ``Neighbor_allgatherv``; return its ``Request``."""
        return neighbor(<Comm>self, NB_ALLGATHERV, NONBLOCKING, sendbuf, recvbuf, backend, None)

    def Ineighbor_alltoall(self, sendbuf, recvbuf, *, backend=None):
        """Start ``Neighbor_alltoall``; return its ``Request``."""
        return neighbor(<Comm>self, NB_ALLTOALL, NONBLOCKING, sendbuf, recvbuf, backend, None)

    def Ineighbor_alltoallv(self, sendbuf, recvbuf, *, backend=None):
        """Start ``Neighbor_alltoallv``; return its ``Request``."""
        return neighbor(<Comm>self, NB_ALLTOALLV, NONBLOCKING, sendbuf, recvbuf, backend, None)

    def Ineighbor_alltoallw(self, sendbuf, recvbuf, *, backend=None):
        """Start ``Neighbor_alltoallw``; return its ``Request``."""
        return neighbor(<Comm>self, NB_ALLTOALLW, NONBLOCKING, sendbuf, recvbuf, backend, None)

    def Neighbor_allgather_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Persistent ``Neighbor_allgather``; arguments as ``Neighbor_allgather``, plus `info`."""
        return neighbor(<Comm>self, NB_ALLGATHER, PERSISTENT, sendbuf, recvbuf, backend, info)

    def Neighbor_allgatherv_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Persistent ``Neighbor_allgatherv``; arguments as ``Neighbor_allgatherv``, plus `info`."""
        return neighbor(<Comm>self, NB_ALLGATHERV, PERSISTENT, sendbuf, recvbuf, backend, info)

    def Neighbor_alltoall_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Persistent ``Neighbor_alltoall``; arguments as ``Neighbor_alltoall``, plus `info`."""
        return neighbor(<Comm>self, NB_ALLTOALL, PERSISTENT, sendbuf, recvbuf, backend, info)

    def Neighbor_alltoallv_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Persistent ``Neighbor_alltoallv``; arguments as ``Neighbor_alltoallv``, plus `info`."""
        return neighbor(<Comm>self, NB_ALLTOALLV, PERSISTENT, sendbuf, recvbuf, backend, info)

    def Neighbor_alltoallw_init(self, sendbuf, recvbuf, info=None, *, backend=None):
        """Persistent ``Neighbor_alltoallw``; arguments as ``Neighbor_alltoallw``, plus `info`."""
        return neighbor(<Comm>self, NB_ALLTOALLW, PERSISTENT, sendbuf, recvbuf, backend, info)

    def neighbor_allgather(self, sendobj):
        """Gather pickled objects from every neighbour (collective); see mpi4py."""
        return (<Comm>self).made("neighbor_allgather", _MPI.Topocomm.neighbor_allgather,
                                 (sendobj,))

    def neighbor_alltoall(self, sendobj):
        """Exchange pickled objects with every neighbour (collective); see mpi4py."""
        return (<Comm>self).made("neighbor_alltoall", _MPI.Topocomm.neighbor_alltoall,
                                 (sendobj,))


class Cartcomm(Comm, _Neighborhood, _MPI.Cartcomm):
    """A communicator with a Cartesian topology (``Comm.Create_cart``): an
    ``mcr.Comm`` (every buffer method, on every backend) and an
    ``mpi4py.MPI.Cartcomm`` (``Get_topo``, ``Get_coords``, ``Shift``, ...,
    and the neighborhood collectives, on every backend)."""

    __slots__ = ()

    def Sub(self, remain_dims):
        """The lower-dimensional grids that keep the dimensions where
        `remain_dims` is true (collective): an ``mcr.Cartcomm`` with this
        communicator's settings; see mpi4py."""
        return (<Comm>self).topology((<Comm>self).made("Sub", _MPI.Cartcomm.Sub,
                                                      (remain_dims,)))


class Graphcomm(Comm, _Neighborhood, _MPI.Graphcomm):
    """A communicator with a graph topology (``Comm.Create_graph``): an
    ``mcr.Comm`` and an ``mpi4py.MPI.Graphcomm`` (``Get_topo``,
    ``Get_neighbors``, ..., and the neighborhood collectives)."""

    __slots__ = ()


class Distgraphcomm(Comm, _Neighborhood, _MPI.Distgraphcomm):
    """A communicator with a distributed graph topology
    (``Comm.Create_dist_graph``, ``Comm.Create_dist_graph_adjacent``): an
    ``mcr.Comm`` and an ``mpi4py.MPI.Distgraphcomm`` (``Get_dist_neighbors``,
    ..., and the neighborhood collectives)."""

    __slots__ = ()


# the calls for which `meet` posts no barrier under a timeout: Free does not
# block, the non-blocking ones (Idup, Ineighbor_...) must not
cdef tuple UNAWAITED_CALLS = ("Free", "Idup", "Idup_with_info", "Ineighbor_allgather",
                               "Ineighbor_allgatherv", "Ineighbor_alltoall",
                               "Ineighbor_alltoallv", "Ineighbor_alltoallw")


# mpi4py's class of a topology communicator -> mcr's
cdef dict TOPOLOGY_CLASSES = {_MPI.Cartcomm: Cartcomm, _MPI.Graphcomm: Graphcomm,
                              _MPI.Distgraphcomm: Distgraphcomm}


# The calls of the buffer methods, by the shape of their arguments (the
# fields a descriptor's parse reads); inline, as each public method makes one.

cdef inline _Call send_call(int op, int form, object backend, object buf, object dest,
                            object tag):
    cdef _Call c = _Call.__new__(_Call)
    c.op, c.form, c.backend = op, form, backend
    c.sendbuf, c.dest, c.tag = buf, dest, tag
    return c


cdef inline _Call recv_call(int form, object backend, object buf, object source, object tag,
                            object status):
    cdef _Call c = _Call.__new__(_Call)
    c.op, c.form, c.backend = CALL_RECV, form, backend
    c.recvbuf, c.source, c.tag, c.status = buf, source, tag, status
    return c


cdef inline _Call sendrecv_call(int form, object backend, object sendbuf, object dest,
                                object sendtag, object recvbuf, object source, object recvtag,
                                object status):
    cdef _Call c = _Call.__new__(_Call)
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
    cdef _Call c = _Call.__new__(_Call)
    c.op, c.form, c.backend, c.info, c.compress = op, form, backend, info, compress
    c.sendbuf, c.recvbuf, c.root, c.redop, c.recvcounts = sendbuf, recvbuf, root, redop, \
        recvcounts
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
