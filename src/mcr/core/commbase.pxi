# _CommBase: what every mcr communicator is beside its buffer methods
# (Comm.pyx): its settings and their chain of interceptors, the calls that
# make and free communicators, and mpi4py's methods on pickled objects (all
# through the chain: `comm_call`). mcr.Comm is the class to use.


cdef class _CommBase(_MPI.Intracomm):
    """The part of ``mcr.Comm`` beside its buffer methods: settings
    (``backend``, ``compress``, ``checked``, ``timeout``), the methods that
    make and free communicators, and mpi4py's methods on pickled objects."""
    cdef object dflt              # default backend name; None means MPI
    cdef _Chooser chooser          # what auto decides here (auto.pxi), at first use
    cdef object compress_dflt      # the compression default (a spec), or None
    cdef bint unlogged             # mcr's private communicator: the logger skips it
    cdef _Watch watch              # checked mode, timeout, records (checkimpl.pxi), or None
    cdef object meeting            # a constructor's barrier that timed out (meet), or None
    cdef list idups                # requests of its Idups, until a watched collective (settle)
    cdef object nbplan             # a topology's neighbourhood rounds (neighbor.pxi), or None
    cdef Py_ssize_t pending        # requests posted here not yet seen to complete (settle)
    cdef MPI_Comm deferred         # freed by Free while some were pending: freed at the last
    cdef unsigned long epoch       # the chain_epoch its chains were built at (chain.pxi)
    cdef tuple chain               # the interceptors its calls run through; None: none
    cdef tuple zchain              # ... and compression, for a call that passes compress

    cdef inline tuple current_chain(self):
        """The interceptors its calls run through (None: none), built again
        when a setting has changed since (chain_epoch); `zchain` with it."""
        if self.epoch != chain_epoch:
            self.chain = build_chain(<Comm>self, None)
            self.zchain = build_chain(<Comm>self, COMPRESSION)
            self.epoch = chain_epoch
        return self.chain

    def __cinit__(self, *args, **kwargs):
        self.deferred = MPI_COMM_NULL
        self.dflt = ENV_BACKEND
        if ENV_CHECK or ENV_TIMEOUT > 0:
            self.set_watch(ENV_CHECK, ENV_TIMEOUT)

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
        if self.watch is None:
            self.watch = _Watch.__new__(_Watch)
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
        return self.pickled_p2p(P2P_SEND, _obj_send, (obj, dest, tag))

    def ssend(self, obj, dest, tag=0):
        """Send a Python object in synchronous mode (mpi4py's method, pickled)."""
        return self.pickled_p2p(P2P_SSEND, _obj_ssend, (obj, dest, tag))

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Receive a Python object (mpi4py's method, pickled)."""
        status_type(status, MPI_DATATYPE_NULL)         # mpi4py's statuses count bytes
        return self.pickled_p2p(P2P_RECV, _obj_recv, (buf, source, tag, status))

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        """Send a Python object and receive one (mpi4py's method, pickled)."""
        status_type(status, MPI_DATATYPE_NULL)
        return self.pickled_p2p(P2P_SENDRECV, _obj_sendrecv, (sendobj, dest, sendtag, recvbuf,
                                                              source, recvtag, status))

    def isend(self, obj, dest, tag=0):
        """Start sending a Python object (mpi4py's method, pickled): a
        request (an ``mcr.Request`` on a watched communicator)."""
        return self.pickled_p2p(P2P_ISEND, _obj_isend, (obj, dest, tag))

    def issend(self, obj, dest, tag=0):
        """Start sending a Python object in synchronous mode (mpi4py's
        method, pickled)."""
        return self.pickled_p2p(P2P_ISSEND, _obj_issend, (obj, dest, tag))

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        """Start receiving a Python object (mpi4py's method, pickled):
        ``wait()`` returns it."""
        return self.pickled_p2p(P2P_IRECV, _obj_irecv, (buf, source, tag))

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Wait for a message, without receiving it (mpi4py's method)."""
        status_type(status, MPI_DATATYPE_NULL)
        return self.pickled_p2p(P2P_PROBE, _obj_probe, (source, tag, status))

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Wait for a message and match it, as an ``mpi4py.MPI.Message``
        (mpi4py's method)."""
        status_type(status, MPI_DATATYPE_NULL)
        return self.pickled_p2p(P2P_MPROBE, _obj_mprobe, (source, tag, status))

    def Mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Wait for a message and match it, as an ``mpi4py.MPI.Message`` (mpi4py's
        method, on MPI). Under a timeout it polls ``Improbe`` and raises
        ``mcr.TimeoutError`` naming it, as ``Probe`` does."""
        cdef int spins = 0
        cdef long long deadline
        status_type(status, MPI_DATATYPE_NULL)
        if self.watch is None or self.watch.timeout <= 0:
            return _MPI.Intracomm.Mprobe(self, source, tag, status)
        deadline = deadline_ns(self.watch.timeout)
        while True:
            message = _MPI.Intracomm.Improbe(self, source, tag, status)
            if message is not None:
                return message
            if now_ns() > deadline:
                _raise_wait_timeout(self, f"Mprobe (source {source}, tag {tag}) [mpi]")
            idle(spins)
            spins += 1

    # a status mcr's typed receive filled counts in its element type until it is written
    # again (Status.Get_count); mpi4py's methods write it too, and count bytes

    def Improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Match a message if one is there, as an ``mpi4py.MPI.Message`` or None
        (mpi4py's method, on MPI)."""
        status_type(status, MPI_DATATYPE_NULL)
        return _MPI.Intracomm.Improbe(self, source, tag, status)

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Match a message of a Python object if one is there (mpi4py's method)."""
        status_type(status, MPI_DATATYPE_NULL)
        return _MPI.Intracomm.improbe(self, source, tag, status)

    def iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Whether a message is there, without receiving it (mpi4py's method)."""
        status_type(status, MPI_DATATYPE_NULL)
        return _MPI.Intracomm.iprobe(self, source, tag, status)

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
        self.made("Free", _free_comm, ())   # (on the chain: a Fusion's open buckets first)

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
        constructors. `request` is an ``mcr.Request`` (with a timeout or the
        flight recorder, its waits time out and its record says when it
        completed); this communicator may be freed before it completes."""
        return self.started("Idup", _MPI.Intracomm.Idup, (info,))

    def Idup_with_info(self, info):
        """Start duplicating the communicator with the hints `info`, as ``Idup``."""
        return self.started("Idup_with_info", _MPI.Intracomm.Idup_with_info, (info,))

    cdef tuple started(self, str call, object make, tuple args):
        """mpi4py's non-blocking constructor `make(self, *args)` (`call`,
        such as "Idup"), through the chain: the communicator and the request
        (an mcr Request; watched, carrying the call's record and the
        timeout), pending on this communicator as its other operations are:
        Free leaves it to MPI until the copy is made (Open MPI would free the
        schedule under it: a segfault in the wait)."""
        comm, request = self.comm_call(COMM_STARTED, NONBLOCKING, call, make, args, -1,
                                       False)
        request = pending_on(<Comm>self, request if isinstance(request, Request)
                             else as_mcr_request(request, 0, None))
        if self.idups is None:
            self.idups = []
        else:                        # (those waited meanwhile: they are done)
            self.idups = [r for r in self.idups if (<Request>r).ob_mpi != MPI_REQUEST_NULL]
        self.idups.append(request)
        return self.inherit(comm), request

    cdef object posted(self, str call, object make, tuple args, str backend="mpi"):
        """The non-blocking collective `make(self, *args)` (`call`, such as
        "Ineighbor_alltoall", inside a call on the chain; mpi4py's, or
        composed on `backend`), returning its request: as `started`."""
        return self.comm_call(COMM_POSTED, NONBLOCKING, call, make, args, -1, True, 0, backend)

    cdef Prequest initialized(self, str call, object make, tuple args, str backend="mpi"):
        """`make(self, *args)`, making the persistent request of a
        neighbourhood collective (`call`, such as "Neighbor_alltoall_init";
        an mcr Prequest running on `backend`), through the chain: watched,
        the processes agree on it here, and its record follows the request
        (watched_prequest)."""
        return self.comm_call(COMM_PERSISTENT, PERSISTENT, call, make, args, -1, True, 0,
                              backend)

    cdef int free_now(self) except -1:
        """Free's own work, at the end of its chain: the backends'
        sub-communicators shut down, then the MPI communicator freed, or,
        with operations still pending, handed to the last of them."""
        if _backends is not None:
            _backends.release(self)       # the Gloo/NCCL sub-communicators first
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
        CHKERR(ierr)
        return 0

    cdef object made(self, str call, object make, tuple args, int root=-1, bint inner=False,
                     str backend="mpi"):
        """mpi4py's method `make(self, *args)` for a collective call outside
        the buffer methods (`call`, such as "Dup" or "bcast"; `root`, or -1),
        through the chain (the progress engine: a Fusion's buckets posted
        first, the call in the engine's window; the watch's number and
        record); `inner`: made by a call on the chain already (a
        neighbourhood collective's: mpi4py's, or composed on `backend`)."""
        return self.comm_call(COMM_MADE, BLOCKING, call, make, args, root, inner, 0, backend)

    cdef object pickled_p2p(self, int p2p, object make, tuple args):
        """mpi4py's point-to-point method `p2p` on pickled objects (one of
        OBJ_P2P_NAMES; `make`: the method, `args`: its arguments in order),
        through the chain (with a timeout or the recorder: obj_p2p,
        checkimpl.pxi)."""
        cdef bint posted = p2p >= P2P_ISEND
        return self.comm_call(COMM_P2P_POSTED if posted else COMM_P2P,
                              NONBLOCKING if posted else BLOCKING, OBJ_P2P_NAMES[p2p], make,
                              args, -1, False, p2p)

    cdef object comm_call(self, int kind, int form, str name, object make, tuple args,
                          int root, bint inner, int p2p=0, str backend="mpi"):
        """A call outside the buffer methods, as a _Call on the chain (none:
        mpi4py's function at once); `backend`: where it runs, for its record."""
        cdef tuple chain = self.current_chain()
        if chain is None:
            return make(self, *args)
        cdef _Call c = _Call.__new__(_Call)
        c.op = COMM_P2P_OP if kind >= COMM_P2P else COMM_OP
        c.form, c.kind, c.p2p, c.callname, c.make, c.makeargs = form, kind, p2p, name, make, args
        c.iroot, c.inner, c.name = root, inner, backend
        if kind >= COMM_P2P:
            name_p2p(c)
        c.chain = chain
        return proceed(<Comm>self, c, 0)

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
        """Create a communicator from a group (collective over the group's
        processes only); see mpi4py. On the chain as the other constructors,
        but checked mode does not agree on it nor a timeout bound it (the
        other processes do not call it): the flight recorder records it."""
        return self.derived(self.comm_call(COMM_GROUP, BLOCKING, "Create_group",
                                           _MPI.Intracomm.Create_group, (group, tag), -1,
                                           False))

    @classmethod
    def Create_from_group(cls, group, stringtag="org.mpi4py", info=None, errhandler=None):
        """Create a communicator from a group without a parent (MPI-4, collective over
        the group's processes); see mpi4py. Returns an object of this class (an
        ``mcr.Comm``), with the settings of ``$MCR_BACKEND``, ``$MCR_TIMEOUT`` and
        ``$MCR_CHECK``, as ``COMM_WORLD``'s."""
        if info is None:
            info = _mpi4py.INFO_NULL
        return of_class(cls, _MPI.Intracomm.Create_from_group(group, stringtag, info,
                                                              errhandler))

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
        ``mcr.Graphcomm`` with this communicator's settings; see mpi4py.

        Raises
        ------
        ValueError
            If an edge names no node of the graph (``len(index)`` nodes), before
            any communication: Open MPI takes it, and its neighbourhood
            collectives would not.
        """
        cdef Py_ssize_t nodes = len(index)
        for k, node in enumerate(edges):
            if node != MPI_PROC_NULL and not 0 <= node < nodes:
                raise ValueError(f"edges: edges[{k}] is {node}; the graph has {nodes} "
                                 f"node{'s' if nodes != 1 else ''} (len(index)), 0 to "
                                 f"{nodes - 1}")
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
        if cls is Distgraphcomm and out.ob_mpi != MPI_COMM_NULL:
            # its neighborhood collectives' rounds (neighbor.pxi; by class:
            # Open MPI 5.0 gives a distributed graph made from a Cartesian
            # communicator the Cartesian topology, Get_topology says CART)
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


def _free_comm(_CommBase comm):
    """Free's own work (_CommBase.free_now), as the function its call runs."""
    comm.free_now()
