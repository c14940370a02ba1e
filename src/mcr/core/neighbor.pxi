# The neighborhood collectives of mcr's topologies (Neighbor_allgather(v),
# Neighbor_alltoall(v,w)), in their three forms, on every backend.
#
# On MPI, mcr calls MPI's own collective on the message it parsed (_NbOnMpi,
# as mpi4py's method is called: its element type, bfloat16 too, and its
# counts), and Neighbor_alltoallw is mpi4py's. A buffer in CUDA memory (a
# torch tensor) is staged through a host copy first, so that every process
# makes the same MPI call whatever memory its buffers are in: MPI matches
# collectives by call.
#
# On another backend they are composed of that backend's Alltoallv on the
# bytes of the buffers, in rounds: a round carries at most one block between
# two processes, so a process that is a neighbour twice (a periodic dimension
# of 1 or 2 processes, a graph with a repeated edge) gets its blocks in
# several rounds, each to its slot, and no block is copied on the way. The
# r-th block from process i to process j matches the r-th slot of j for i, in
# MPI's order: for a Cartesian grid, a block sent towards the negative
# direction of a dimension arrives in the slot of the neighbour in the
# positive direction (MPI 4.0, 8.6); for a graph, in the order the edges come.
# Before the data, the processes swap the sizes of the blocks (two small MPI
# collectives, see nb_matched; non-blocking stages in a non-blocking call): a
# backend's all-to-all must know them exactly.
#
# The rounds of a communicator are worked out at its first neighborhood call,
# without communicating, and kept; a distributed graph's number of rounds is
# agreed when mcr makes it (an MPI allreduce, see nb_agreed).
#
# A non-blocking composed call is a staged operation (mcr.stages, see
# nb_staged): its size exchange, agreement and rounds run on private
# communicators, posted in call order on every process, and every wait of
# the process drives them.
#
# Open MPI (5.0) runs the non-blocking and persistent forms of
# MPI_Neighbor_alltoall(v) on a Cartesian grid with a periodic dimension of 1
# or 2 processes in the order MPI had before 4.0 (a block sent towards the
# negative direction arrives in the slot of the negative direction), unlike its
# blocking form. On such a grid those forms are composed on MPI too, so that
# every form gives MPI 4.0's result on every backend; Neighbor_alltoallw's
# (derived datatypes, MPI only) are one MPI alltoallw in that order instead
# (_nb_alltoallw_in_order).
#
# A graph whose neighbours include MPI_PROC_NULL (as at the border of a
# Cartesian grid: Open MPI makes such graphs, and the MPI Forum means to allow
# them, mpi-issues #87) crashes Open MPI's neighborhood collectives (5.0: a
# receive posted from PROC_NULL), and so does a distributed graph made by
# Create_dist_graph_adjacent from a Cartesian or graph communicator (Open MPI
# labels it with its parent's topology, and reads its neighbours as such:
# mcr tells the topologies apart by class, see nb_plan). Every form runs
# composed on MPI there (alltoallw: in order, as above), and a PROC_NULL
# neighbour's block is left as it was, as on a grid's border.

cdef enum:
    NB_ALLGATHER
    NB_ALLGATHERV
    NB_ALLTOALL
    NB_ALLTOALLV
    NB_ALLTOALLW

cdef tuple NB_NAMES = ("allgather", "allgatherv", "alltoall", "alltoallv", "alltoallw")


# [form][kind]: the method's name (Neighbor_alltoall, Ineighbor_alltoall,
# Neighbor_alltoall_init), and mpi4py's method
cdef tuple NB_METHODS = (tuple("Neighbor_" + k for k in NB_NAMES),
                         tuple("Ineighbor_" + k for k in NB_NAMES),
                         tuple("Neighbor_" + k + "_init" for k in NB_NAMES))
cdef tuple NB_MPI4PY = tuple(tuple(getattr(_MPI.Topocomm, name) for name in names)
                             for names in NB_METHODS)


cdef inline str nb_method(int kind, int form):
    return NB_METHODS[form][kind]


cdef object neighbor(Comm comm, int kind, int form, object sendbuf, object recvbuf,
                     object backend, object info):
    """Neighborhood collective `kind` in `form` on `comm` (a topology), on
    `backend` (auto: MPI, as there is no tuning entry for these), through
    the communicator's interceptors (op CALL_COUNT + kind, arguments
    (sendbuf, recvbuf)) as a buffer method's call."""
    cdef tuple chain = comm.current_chain()
    cdef _Call c
    if chain is None:
        result = nb_run(comm, kind, form, sendbuf, recvbuf, backend, info)
    else:
        comm.prologue(None)
        c = coll_call(CALL_COUNT + kind, form, backend, info, None, sendbuf, recvbuf)
        c.sub = comm.chained_sub(backend)
        c.chain = chain
        result = proceed(comm, c, 0)
    return pending_on(comm, result) if form == NONBLOCKING else result


cdef object nb_log_msg(Comm comm, _Call c):
    """The logger's description of neighbourhood call `c`: its message,
    parsed for the record (the call parses it again), or None for
    alltoallw (derived datatypes)."""
    cdef int kind = c.op - CALL_COUNT
    if kind == NB_ALLTOALLW:
        return None
    cdef tuple plan = nb_plan(comm)
    return nb_msg(kind, c.sendbuf, c.recvbuf, len(plan[1]), len(plan[2]))


cdef Prequest nb_persistent(Prequest preq, int kind, str backend, object m):
    """`preq`, a persistent neighborhood collective on `backend`, made known
    to the logger, which records each Start (described from `m`, the parsed
    message: kept as the buffers')."""
    preq.op = CALL_COUNT + kind + 1
    preq.backend = backend
    if m is not None:
        preq.keep = m
    return preq


cdef int nb_describe(_Rec r, Comm comm, int kind, object m) except -1:
    """Set the size, count, element type and device of the record of a
    neighborhood collective from its parsed message `m` (None: alltoallw, of
    derived datatypes): the whole result of an allgather(v), the whole input
    of an alltoall(v), as for the collectives (describe)."""
    if type(m) is not _Call:
        r.dtype = "derived"
        return 0
    cdef _Call msg = <_Call>m
    cdef tuple plan = nb_plan(comm)
    cdef side *x = &msg.r if kind <= NB_ALLGATHERV else &msg.s
    cdef int degree = len(plan[1]) if kind <= NB_ALLGATHERV else len(plan[2])
    r.count = total(x, degree)
    r.nbytes = r.count * x.extent
    r.dtype = TYPE_NAMES[x.tindex] if x.tindex >= 0 else "derived"
    if msg.s.addr != NULL and msg.s.device >= 0:
        r.device = msg.s.device
    elif msg.r.addr != NULL and msg.r.device >= 0:
        r.device = msg.r.device
    return 0


cdef object nb_run(Comm comm, int kind, int form, object sendbuf, object recvbuf,
                   object backend, object info):
    cdef str name = nb_method(kind, form)
    comm.prologue(None)
    sub = comm.sub(backend)
    if sub is AUTO_SUB:
        sub = None
    cdef tuple plan = nb_plan(comm)
    if sub is None and kind != NB_ALLTOALLW and (plan[7] or plan[6] and form != BLOCKING
                                                 and kind >= NB_ALLTOALL):
        sub = MPI_SUB                   # see above: composed on MPI
    if kind != NB_ALLTOALLW:
        for spec, arg in ((sendbuf, "sendbuf"), (recvbuf, "recvbuf")):
            if spec is None:        # (as mpi4py's: MPI would match its blocks with none)
                raise TypeError(f"{arg}: expected a buffer or a message spec, got None "
                                f"({name} takes no empty message)")
    if sub is not None:
        if kind == NB_ALLTOALLW:
            raise nb_alltoallw_refused(form, sub.name)
        if comm.current_chain() is None:
            return nb_composed(comm, kind, form, sub, sendbuf, recvbuf)
        # through the chain as mpi4py's methods below, the record naming the backend
        args, where = (sendbuf, recvbuf, kind, form, sub), "mpi" if sub is MPI_SUB else sub.name
        if form == BLOCKING:
            return comm.made(name, _nb_composed, args, -1, True, where)
        if form == NONBLOCKING:
            return comm.posted(name, _nb_composed, args, where)
        return comm.initialized(name, _nb_composed, args, where)
    fn = NB_MPI4PY[form][kind]
    if kind == NB_ALLTOALLW:
        # mcr's checks first, the same in every form (mpi4py's name no argument)
        nb_w_side(sendbuf, len(plan[2]), "sendbuf")
        nb_w_side(recvbuf, len(plan[1]), "recvbuf")
        if plan[7] or plan[6] and form != BLOCKING:
            # see above: Open MPI's would take the old order, or crash
            fn = _nb_alltoallw_waited if form == BLOCKING else _nb_alltoallw_in_order
    cdef _Call m = None
    if kind != NB_ALLTOALLW:
        # mcr's checks first, as on the other backends (mpi4py would leave
        # some to MPI), and MPI called on the message they parsed (_NbOnMpi)
        m = nb_msg(kind, sendbuf, recvbuf, len(plan[1]), len(plan[2]))
        if not needs_staging(m):
            return nb_native(comm, kind, form, name, nb_on_mpi(kind, form, m), sendbuf,
                             recvbuf, info, m)
    cdef tuple staged = nb_stage(sendbuf, "sendbuf") + nb_stage(recvbuf, "recvbuf")
    sendspec, recvspec = staged[0], staged[2]
    if m is not None:                                # on the host copies
        fn = nb_on_mpi(kind, form, nb_msg(kind, sendspec, recvspec, len(plan[1]),
                                          len(plan[2])))
    if staged[1] is None and staged[3] is None:      # host memory: as it is
        return nb_native(comm, kind, form, name, fn, sendbuf, recvbuf, info, m)
    if form == BLOCKING:
        comm.made(name, fn, (sendspec, recvspec), -1, True)
        nb_unstage(staged[3])
        return None
    if form == NONBLOCKING:
        return nb_staged_request(comm.posted(name, fn, (sendspec, recvspec)), staged)
    return nb_persistent(comm.initialized(name, _nb_init, (sendspec, recvspec, fn, info, staged)),
                         kind, "mpi", m)


cdef object nb_native(Comm comm, int kind, int form, str name, object fn, object sendbuf,
                      object recvbuf, object info, object m):
    """`fn` (`name`: _NbOnMpi, or mpi4py's method for alltoallw) on buffers in
    host memory (`m`: their parsed message, or None)."""
    if form == BLOCKING:
        return comm.made(name, fn, (sendbuf, recvbuf), -1, True)
    if form == NONBLOCKING:
        q = comm.posted(name, fn, (sendbuf, recvbuf))
        return q if isinstance(q, Request) else as_mcr_request(q, 0, None)
    return nb_persistent(comm.initialized(name, _nb_init, (sendbuf, recvbuf, fn, info, None)),
                         kind, "mpi", m)


def _nb_init(comm, sendbuf, recvbuf, fn, info, tuple staged):
    """The persistent neighbourhood collective `fn` (mpi4py's method, or one
    as it: _NbOnMpi) on `comm` as an mcr Prequest (`staged`: its buffers
    staged through host memory, nb_stage's, or None)."""
    native = fn(comm, sendbuf, recvbuf, _mpi4py.INFO_NULL if info is None else info)
    if staged is None:
        return nb_prequest(<Comm>comm, native)
    return emulated_prequest(comm, partial(_nb_start_staged, native, staged), (native, staged))


cdef _NbOnMpi nb_on_mpi(int kind, int form, _Call m):
    cdef _NbOnMpi fn = _NbOnMpi.__new__(_NbOnMpi)
    fn.kind, fn.form, fn.m = kind, form, m
    return fn


@cython.final
cdef class _NbOnMpi:
    """MPI's neighbourhood collective `kind` in `form` on message `m` (nb_msg's,
    of the arguments it is called with), called as mpi4py's method:
    (comm, sendbuf, recvbuf[, info]); mpi4py's request in the non-blocking
    and persistent forms, holding `m` and so its buffers. (mpi4py's methods
    parse the message again, their way: a bfloat16 tensor, which has no
    buffer format, moves as MPI_BYTE with its counts read as bytes, and a
    process with no source or no destination infers a wrong count per
    neighbour: a truncation error, or a hang.)"""
    cdef int kind, form
    cdef _Call m

    def __call__(self, comm, sendbuf, recvbuf, info=None):
        if self.form == BLOCKING:
            nb_post(<Comm?>comm, self.kind, BLOCKING, self.m, MPI_INFO_NULL, NULL)
            return None
        cdef _MPI.Request q = (_MPI.Prequest.__new__(_MPI.Prequest) if self.form == PERSISTENT
                               else _MPI.Request.__new__(_MPI.Request))
        nb_post(<Comm?>comm, self.kind, self.form, self.m, as_info(info), &q.ob_mpi)
        q.ob_buf = self.m
        return q


cdef int nb_post(Comm comm, int kind, int form, _Call m, MPI_Info info,
                 MPI_Request *req) except -1:
    """Call MPI's neighbourhood collective `kind` in `form` on message `m`."""
    cdef int ierr
    cdef side *s = &m.s
    cdef side *r = &m.r
    cdef side other
    cdef tuple plan = nb_plan(comm)
    if (kind == NB_ALLGATHER or kind == NB_ALLTOALL) and (not plan[1]) != (not plan[2]):
        # a side with no neighbour. Open MPI (5.0) wants a process's send and
        # receive blocks the same size (else MPI_ERR_TRUNCATE) and skips the
        # call where a count is 0 (its neighbours wait): that side gets the
        # other's block, which it never moves. MPICH refuses a count on an
        # empty buffer ("Null buffer pointer"): there that side's count is 0
        if library_is_mpich():
            other = m.r if not plan[1] else m.s
            other.count = 0
        else:
            other = m.s if not plan[1] else m.r
            other.addr = m.r.addr if not plan[1] else m.s.addr
        if not plan[1]:
            r = &other
        else:
            s = &other
    with nogil:
        if kind == NB_ALLGATHER:
            ierr = mcr_neighbor_allgather(form, s.addr, s.count, s.dtype, r.addr, r.count,
                                          r.dtype, comm.ob_mpi, info, req)
        elif kind == NB_ALLGATHERV:
            ierr = mcr_neighbor_allgatherv(form, s.addr, s.count, s.dtype, r.addr, r.counts,
                                           r.displs, r.dtype, comm.ob_mpi, info, req)
        elif kind == NB_ALLTOALL:
            ierr = mcr_neighbor_alltoall(form, s.addr, s.count, s.dtype, r.addr, r.count,
                                         r.dtype, comm.ob_mpi, info, req)
        else:
            ierr = mcr_neighbor_alltoallv(form, s.addr, s.counts, s.displs, s.dtype, r.addr,
                                          r.counts, r.displs, r.dtype, comm.ob_mpi, info, req)
    if ierr == ERR_NO_PERSISTENT:
        raise NotImplementedError(f"{nb_method(kind, form)}: this MPI library has no "
                                  "persistent neighborhood collectives (MPI 4.0)")
    CHKERR(ierr)
    return 0


cdef object nb_vector_form(object spec):
    """mcr's vector message [buf, counts, displs] as mpi4py's [buf, (counts,
    displs)]; any other form as it is."""
    if isinstance(spec, (list, tuple)) and len(spec) == 3 and not (
            spec[2] is None or is_datatype(spec[2]) or isinstance(spec[1], tuple)):
        return [spec[0], (spec[1], spec[2])]
    return spec


cdef Prequest nb_prequest(Comm comm, _MPI.Prequest q):
    """mpi4py's persistent request `q` as an mcr Prequest (its handle and
    buffers moved over)."""
    cdef Prequest preq = Prequest.__new__(Prequest)
    preq.ob_mpi, q.ob_mpi = q.ob_mpi, MPI_REQUEST_NULL
    preq.ob_buf, q.ob_buf = q.ob_buf, None
    preq.comm = comm
    if type(preq.ob_buf) is _Call:      # (MPI called on mcr's message: Start checks it)
        preq.places = tensor_places(<_Call>preq.ob_buf)
    return preq


cdef list nb_objects(sendobj, Py_ssize_t nout):
    """neighbor_alltoall's `sendobj` as a list, one object per destination."""
    objs = list(sendobj)
    if len(objs) != nout:
        raise ValueError(f"sendobj: {len(objs)} objects for {nout} neighbours "
                         "(one per neighbour)")
    return objs


def _obj_nb_alltoall(comm, sendobj):
    """mpi4py's neighbor_alltoall, its object count checked first (mpi4py's
    own message does not name the argument)."""
    return _MPI.Topocomm.neighbor_alltoall(
        comm, nb_objects(sendobj, len(nb_plan(<Comm>comm)[2])))


def _obj_nb_composed(comm, sendobj, int kind):
    """mpi4py's neighbor_allgather (`kind` NB_ALLGATHER) or neighbor_alltoall
    composed on MPI, where mpi4py's method would crash (nb_plan: a graph Open
    MPI takes for a grid, or one with PROC_NULL neighbours): each object
    pickled by mpi4py's ``MPI.pickle``, the sizes, then the bytes, moved as
    the buffer calls move them."""
    from array import array
    from itertools import accumulate
    cdef tuple plan = nb_plan(<Comm>comm)
    cdef Py_ssize_t nin = len(plan[1]), nout = len(plan[2])
    dumps, loads = _mpi4py.pickle.dumps, _mpi4py.pickle.loads
    if kind == NB_ALLTOALL:
        blobs = [dumps(obj) for obj in nb_objects(sendobj, nout)]
    else:
        blobs = [dumps(sendobj)] * nout
    scounts, rcounts = array("q", map(len, blobs)), array("q", bytes(8 * nin))
    nb_composed(<Comm>comm, NB_ALLTOALL, BLOCKING, MPI_SUB, [scounts, nout and 1],
                [rcounts, nin and 1])
    sdispls = [0, *accumulate(scounts)][:nout]
    rdispls = [0, *accumulate(rcounts)][:nin]
    received = bytearray(sum(rcounts))
    nb_composed(<Comm>comm, NB_ALLTOALLV, BLOCKING, MPI_SUB,
                [b"".join(blobs), list(scounts), sdispls], [received, list(rcounts), rdispls])
    view = memoryview(received)          # (a PROC_NULL source sends nothing: None)
    return [loads(view[d:d + n]) if n else None for d, n in zip(rdispls, rcounts)]


def _nb_composed(comm, sendbuf, recvbuf, int kind, int form, sub):
    """nb_composed, as the chain (its buffers first, as mpi4py's methods
    take them) and a persistent request's start call it."""
    return nb_composed(<Comm>comm, kind, form, sub, sendbuf, recvbuf)


# -- Neighbor_alltoallw in MPI 4.0's order, on MPI -------------------------------------
# One MPI alltoallw over the whole communicator: what goes between two processes
# travels as one block, a struct of their blocks in the order of their rounds
# (nb_plan), so the r-th block from i to j lands in the r-th slot of j for i.

def _nb_alltoallw_in_order(comm, sendbuf, recvbuf, info=None):
    """mpi4py's Ineighbor_alltoallw (with `info`: Neighbor_alltoallw_init),
    as an Ialltoallw (Alltoallw_init) in MPI 4.0's order; the structs it
    makes are freed when the request lets go of its buffers."""
    cdef tuple plan = nb_plan(<Comm>comm)
    cdef list made = []
    try:
        s = nb_w_blocks(plan[0], plan[2], plan[3],
                        nb_w_side(sendbuf, len(plan[2]), "sendbuf"), made)
        r = nb_w_blocks(plan[0], plan[1], plan[4],
                        nb_w_side(recvbuf, len(plan[1]), "recvbuf"), made)
        q = _MPI.Comm.Ialltoallw(comm, s, r) if info is None else \
            _MPI.Comm.Alltoallw_init(comm, s, r, info)
    except BaseException:
        _nb_free_types(made)
        raise
    if made:
        (<_MPI.Request>q).ob_buf = ((<_MPI.Request>q).ob_buf, _NbTypes(made))
    return q


def _nb_alltoallw_waited(comm, sendbuf, recvbuf):
    """_nb_alltoallw_in_order, waited: Neighbor_alltoallw on a graph with
    MPI_PROC_NULL neighbours."""
    (<_MPI.Request>_nb_alltoallw_in_order(comm, sendbuf, recvbuf)).Wait()


cdef tuple nb_w_side(object spec, int degree, str arg):
    """An alltoallw message in one of mpi4py's forms ([buf, datatypes],
    [buf, (counts, displs), datatypes], [buf, counts, displs, datatypes]) as
    (buf, counts, byte displs, datatypes), `degree` of each."""
    if not isinstance(spec, (list, tuple)) or not 2 <= len(spec) <= 4:
        raise ValueError(f"{arg}: expected [buf, datatypes], [buf, (counts, displs), "
                         f"datatypes] or [buf, counts, displs, datatypes], got {spec!r:.80}")
    if len(spec) == 2:
        if spec[0] is BOTTOM:
            raise ValueError(f"{arg}: BOTTOM needs counts and displacements")
        buf, counts, displs, types = spec[0], [1] * degree, [0] * degree, spec[1]
    elif len(spec) == 3:
        buf, (counts, displs), types = spec
    else:
        buf, counts, displs, types = spec
    out = [list(counts), list(displs), list(types)]
    for what, values in zip(("counts", "displacements", "datatypes"), out):
        if len(values) != degree:
            raise ValueError(f"{arg}: {len(values)} {what} for {degree} neighbours")
    for t in out[2]:
        if not isinstance(t, _mpi4py.Datatype):
            raise TypeError(f"{arg}: expected MPI datatypes, got {type(t).__name__}")
    return (buf, *out)


cdef list nb_w_blocks(int size, list ranks, list rounds, tuple side, list made):
    """`side`'s blocks to (or from) `ranks` as an alltoallw message over the
    `size` processes: a process's blocks in the order of their `rounds`, as
    one struct where there are several (appended to `made`, committed)."""
    buf, counts, displs, types = side
    cdef dict per = {}
    for k, j in enumerate(ranks):
        if j != MPI_PROC_NULL:
            per.setdefault(j, []).append((rounds[k], k))
    cdef list c = [0] * size, d = [0] * size, t = [_mpi4py.BYTE] * size
    for j, blocks in per.items():
        ks = [k for _, k in sorted(blocks)]
        if len(ks) == 1:
            c[j], d[j], t[j] = counts[ks[0]], displs[ks[0]], types[ks[0]]
        else:
            struct = _mpi4py.Datatype.Create_struct([counts[k] for k in ks],
                                                    [displs[k] for k in ks],
                                                    [types[k] for k in ks])
            made.append(struct)
            struct.Commit()
            c[j], t[j] = 1, struct
    return [buf, c, d, t]


cdef int _nb_free_types(list types) except -1:
    cdef int finalized = 0
    MPI_Finalized(&finalized)
    if not finalized:
        for t in types:
            t.Free()
    types.clear()
    return 0


cdef class _NbTypes:
    """The structs of an in-order alltoallw, freed with the last reference to
    them: its request's, once the operation is over (or freed)."""
    cdef list types

    def __cinit__(self, list types):
        self.types = types

    def __dealloc__(self):
        _nb_free_types(self.types)


# -- On MPI: CUDA memory staged through host copies -----------------------------------

cdef tuple nb_stage(object spec, str arg):
    """(the spec to give mpi4py, (tensor, host copy) or None): a torch tensor
    in CUDA memory (any tensor when tests stage host buffers) is replaced by a
    copy in host memory; other device memory is refused, as mcr reads CUDA
    memory through torch only (DLPack's devices 1 and 3: host, pinned host)."""
    buf = spec[0] if isinstance(spec, (list, tuple)) and len(spec) else spec
    if _Tensor is not None and isinstance(buf, _Tensor):
        if buf.is_cpu and not stage_host:
            return spec, None
        if not buf.is_contiguous():
            raise BufferError(f"{arg}: the tensor is not contiguous (strides "
                              f"{tuple(buf.stride())}); pass a contiguous one")
        host = buf.detach().to("cpu", copy=True)
        return (host if spec is buf else [host] + list(spec[1:])), (buf, host)
    if hasattr(buf, "__cuda_array_interface__") or (
            hasattr(buf, "__dlpack_device__") and buf.__dlpack_device__()[0] not in (1, 3)):
        raise TypeError(f"{arg}: {type(buf).__name__} in device memory: mcr reads CUDA "
                        "memory through torch tensors")
    return spec, None


cdef int nb_restage(tuple staged) except -1:
    """Copy the tensors into their host copies again (a persistent request's
    start: the receive's too, for the slots no neighbour fills)."""
    for pair in (staged[1], staged[3]):
        if pair is not None:
            pair[1].copy_(pair[0])
    return 0


cdef int nb_unstage(object rpair) except -1:
    """Copy the received host copy back into the tensor (stream-ordered on
    the caller's current stream)."""
    if rpair is not None:
        rpair[0].copy_(rpair[1])
    return 0


cdef Request nb_staged_request(object posted, tuple staged):
    """The Request of a non-blocking call on host copies: complete when
    mpi4py's request `posted` (an mcr Request when watched) is, then copies the
    result back; it carries the watched request's timeout and record."""
    cdef Request inner = <Request>posted if isinstance(posted, Request) else None
    work = _Tested(inner) if inner is not None else _NbNative(posted)
    cdef Request req = _work_request("mpi", [work], [partial(nb_unstage, staged[3])],
                                     (posted, staged))
    if inner is not None:
        req.obs, inner.obs = inner.obs, None
    return req


def _nb_start_staged(native, tuple staged):
    """A start of a persistent neighborhood collective on host copies."""
    nb_restage(staged)
    (<_MPI.Prequest>native).Start()
    return _work_request("mpi", [_NbNative(native)], [partial(nb_unstage, staged[3])], staged)


cdef class _NbNative:
    """mpi4py's request as a work handle."""
    cdef object req

    def __cinit__(self, req):
        self.req = req

    def is_completed(self):
        return _MPI.Request.Test(self.req)

    def wait(self):
        pass


# -- On another backend: composed of Alltoallv rounds ---------------------------------

cdef object MPI_SUB = object()     # nb_composed on MPI (see above)


cdef object nb_composed(Comm comm, int kind, int form, object sub, object sendbuf,
                        object recvbuf):
    # (a distributed graph's rounds are agreed here in a blocking call, in
    # the steps of the request in a non-blocking one: it must not wait at the
    # call; a persistent one's at each Start)
    cdef tuple plan = nb_agreed(comm) if form == BLOCKING else nb_plan(comm)
    cdef _Call m = nb_msg(kind, sendbuf, recvbuf, len(plan[1]), len(plan[2]))
    cdef str name = "mpi" if sub is MPI_SUB else sub.name
    if nb_derived(m):
        if sub is MPI_SUB:                 # a derived datatype: MPI's own order
            q = NB_MPI4PY[form][kind](comm, nb_vector_form(sendbuf), nb_vector_form(recvbuf),
                                      *((_mpi4py.INFO_NULL,) if form == PERSISTENT else ()))
            # (the caller met the others already: mcr's request, as nb_native gives)
            return as_mcr_request(q, 0, None) if form == NONBLOCKING else \
                nb_persistent(nb_prequest(comm, q), kind, "mpi", m)
        raise nb_derived_refused(kind, form, name)
    cdef bint on_device = m.s.device >= 0 or m.r.device >= 0
    if sub is MPI_SUB and not on_device:       # (no torch for a program on numpy arrays)
        sbytes, rbytes = host_bytes(&m.s, m.sown), host_bytes(&m.r, m.rown)
    else:
        sbytes = _backend_side(m.side(0)).bytes()
        rbytes = _backend_side(m.side(1)).bytes()
    rounds = nb_rounds(plan, kind, m)
    if form == BLOCKING:
        nb_matched(comm, rounds)
        for sc, sd, rc, rd in rounds:
            nb_alltoallv(comm, sub, BLOCKING, name, [sbytes, sc, sd], [rbytes, rc, rd])
        return None
    if form == NONBLOCKING:
        return nb_staged(comm, sub, name, sbytes, rbytes, plan, kind, m, rounds, on_device)
    if sub is not MPI_SUB:                 # what the backend refuses fails now, not at Start
        for sc, sd, rc, rd in rounds:
            nb_alltoallv(comm, sub, PERSISTENT, name, [sbytes, sc, sd], [rbytes, rc, rd])
    return nb_persistent(emulated_prequest(comm, partial(_nb_composed, comm, sendbuf, recvbuf,
                                                         kind, NONBLOCKING, sub), m),
                         kind, name, m)


cdef inline bint nb_derived(_Call m):
    """Whether a side of neighbourhood message `m` is in a derived datatype."""
    return (m.sown is not None and m.s.tindex < 0) or (m.rown is not None and m.r.tindex < 0)


cdef object nb_derived_refused(int kind, int form, str backend):
    return ValueError(f"{nb_method(kind, form)}: backend {backend!r} moves torch element "
                      "types; a derived datatype runs on backend 'mpi'")


cdef object nb_alltoallw_refused(int form, str backend):
    return ValueError(f"{nb_method(NB_ALLTOALLW, form)}: backend {backend!r} cannot run it "
                      "(one MPI datatype per neighbour); use backend='mpi'")


cdef object nb_refusal(Comm comm, _Call c):
    """What this process refuses of neighbourhood call `c` on its own (its
    message, as nb_msg parses it; a derived datatype on a backend other than
    MPI; alltoallw's message as mcr checks it, its datatypes left to MPI; a
    backend that could not be had), or None: found before the processes meet
    (nb_refused, checkimpl.pxi), as a buffer method's refusal is."""
    cdef int kind = c.op - CALL_COUNT
    if type(c.sub) is _BadBackend:
        return (<_BadBackend>c.sub).exc
    cdef tuple plan
    cdef _Call m
    try:
        plan = nb_plan(comm)
        if kind == NB_ALLTOALLW:
            if c.sub is not None and c.sub is not AUTO_SUB:
                return nb_alltoallw_refused(c.form, c.sub.name)
            nb_w_side(c.sendbuf, len(plan[2]), "sendbuf")
            nb_w_side(c.recvbuf, len(plan[1]), "recvbuf")
            return None
        m = nb_msg(kind, c.sendbuf, c.recvbuf, len(plan[1]), len(plan[2]))
        if nb_derived(m) and c.sub is not None and c.sub is not AUTO_SUB:
            return nb_derived_refused(kind, c.form, c.sub.name)
    except _builtins.Exception as exc:      # (Python's: KeyboardInterrupt and the like propagate)
        return exc
    return None


cdef class _Done:
    """A work handle that is complete (a call with no rounds)."""

    def is_completed(self):
        return True

    def wait(self):
        pass


cdef object nb_alltoallv(Comm comm, object sub, int form, str name, object sendspec,
                         object recvspec):
    """One round: an Alltoallv of bytes on `sub`'s backend (MPI_SUB: MPI)."""
    cdef _Call c = coll_call(CALL_ALLTOALLV, form, name, None, None, sendspec, recvspec)
    if sub is MPI_SUB:
        return comm.on_mpi(c, False)
    return comm.on_backend(sub, c, name)


@cython.final
cdef class _HostBytes:
    """The bytes of a parsed side in host memory, as a buffer (format "B"):
    what the rounds of a neighbourhood call composed on MPI move (on another
    backend, or from device memory, they move the side's torch tensor).
    `owner` keeps the memory alive."""
    cdef char *addr
    cdef Py_ssize_t nbytes
    cdef object owner

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self.addr, self.nbytes, 0, flags)


cdef _HostBytes host_bytes(side *x, object owner):
    """The bytes of side `x` of a message, owned by `owner` (None: no bytes)."""
    cdef _HostBytes b = _HostBytes.__new__(_HostBytes)
    if owner is not None:
        b.addr, b.nbytes, b.owner = x.addr, x.nelems * x.extent, owner
    return b


cdef object _backend_side_class = None


cdef object _backend_side(tuple described):
    """mcr.backends.message.Side over a parsed side (its bytes as a tensor)."""
    global _backend_side_class
    if _backend_side_class is None:
        _backend_side_class = service("message").Side
    return _backend_side_class(described)


cdef _Call nb_msg(int kind, object sendbuf, object recvbuf, int indegree, int outdegree):
    """Both sides parsed as mpi4py does (its message forms), a block per
    neighbour; the receive blocks must not overlap, nor the two sides, and both
    sides must have the same element type."""
    cdef _Call m = _Call.__new__(_Call)
    m.op = CALL_COUNT + kind
    if kind == NB_ALLTOALLV:
        m.sown = parse_vector(sendbuf, &m.s, False, outdegree, b"sendbuf", m.sroom, True)
    else:
        m.sown = parse_simple(sendbuf, &m.s, False, b"sendbuf")
        if kind == NB_ALLTOALL:
            per_neighbour(&m.s, outdegree, b"sendbuf")
    if kind == NB_ALLGATHER or kind == NB_ALLTOALL:
        m.rown = parse_simple(recvbuf, &m.r, True, b"recvbuf")
        per_neighbour(&m.r, indegree, b"recvbuf")
    else:
        m.rown = parse_vector(recvbuf, &m.r, True, indegree, b"recvbuf", m.rroom, True)
        check_blocks_disjoint(&m.r, indegree, b"recvbuf")
    # MPI: a block's type signature is the same at every process (of the v
    # kinds, only the element types are known to match here)
    cdef bint blocks = (kind == NB_ALLGATHER or kind == NB_ALLTOALL) and indegree and outdegree
    cdef int scount = m.s.count if blocks else 0
    cdef int rcount = m.r.count if blocks else 0
    if m.sown is None or m.rown is None:
        same = scount == rcount       # an empty side (None) has no element type to match
    else:
        same = same_signature(&m.s, scount, &m.r, rcount)
        check_apart(&m.s, &m.r, outdegree if kind == NB_ALLTOALL else 1, indegree,
                    kind == NB_ALLGATHERV or kind == NB_ALLTOALLV, NULL)
    if not same:
        raise ValueError(f"recvbuf: {m.r.count} elements per neighbour, but sendbuf "
                         f"sends {m.s.count}: the blocks of {nb_method(kind, BLOCKING)} are "
                         "the same size at every process"
                         + signature_bytes(&m.s, scount, &m.r, rcount))
    return m


cdef int per_neighbour(side *x, int n, const char *arg) except -1:
    """A block message's count per neighbour (per_process, for neighbours)."""
    if n == 0:
        return 0
    if x.explicit:
        check_capacity(x, <Py_ssize_t>x.count * n, arg,
                       f"{x.count} elements per neighbour x {n} neighbours")
    elif x.count % n:
        raise ValueError(f"{argstr(arg)}: {x.count} elements do not split evenly among "
                         f"{n} neighbours")
    else:
        x.count //= n
    return 0


cdef tuple nb_plan(Comm comm):
    """(size, sources, destinations, round of each destination's block,
    round of each source's slot, rounds, whether Open MPI's non-blocking
    alltoall would take the wrong order: see above, whether Open MPI's own
    would crash: a graph's neighbours include MPI_PROC_NULL, or a distributed
    graph Open MPI labels with another topology, see above), worked out once
    per communicator, without communicating (a distributed graph's rounds:
    -1 - this process's own, until nb_agreed)."""
    if comm.nbplan is not None:
        return comm.nbplan
    # the topology by mcr's class: Get_topology answers CART (GRAPH) for a
    # distributed graph made from a Cartesian (graph) communicator
    topology = _mpi4py.CART if isinstance(comm, Cartcomm) else _mpi4py.GRAPH \
        if isinstance(comm, Graphcomm) else _mpi4py.DIST_GRAPH \
        if isinstance(comm, Distgraphcomm) else _mpi4py.UNDEFINED
    cdef int size = comm.nprocs()
    if topology == _mpi4py.CART:
        sources, skeys, rkeys = [], [], []
        for d in range(_MPI.Cartcomm.Get_dim(comm)):
            sources += _MPI.Cartcomm.Shift(comm, d, 1)
            skeys += [(d, 0), (d, 1)]          # towards the negative, the positive direction
            rkeys += [(d, 1), (d, 0)]          # sent towards the positive, the negative one
        dests = sources
    elif topology == _mpi4py.GRAPH:
        sources = dests = list(_MPI.Graphcomm.Get_neighbors(comm, _MPI.Comm.Get_rank(comm)))
        skeys = rkeys = list(range(len(sources)))
    elif topology == _mpi4py.DIST_GRAPH:
        sources, dests, _ = _MPI.Distgraphcomm.Get_dist_neighbors(comm)
        sources, dests = list(sources), list(dests)
        skeys, rkeys = list(range(len(dests))), list(range(len(sources)))
    else:
        raise ValueError("comm: the communicator has no topology")
    sround, rround = rounds_of(dests, skeys), rounds_of(sources, rkeys)
    rounds = max(sround + rround, default=-1) + 1
    if topology == _mpi4py.GRAPH:
        # every process knows the whole graph: its most repeated edge
        index, edges = _MPI.Graphcomm.Get_topo(comm)
        for i in range(len(index)):
            mine = edges[index[i - 1] if i else 0:index[i]]
            rounds = max([rounds] + [mine.count(j) for j in set(mine) if j != MPI_PROC_NULL])
    elif topology == _mpi4py.DIST_GRAPH:
        rounds = -1 - rounds            # nb_agreed: the processes agree on it first
    comm.nbplan = (size, sources, dests, sround, rround, rounds,
                   topology == _mpi4py.CART and rounds > 1,
                   topology != _mpi4py.CART and MPI_PROC_NULL in sources + dests
                   or topology != _MPI.Comm.Get_topology(comm))
    return comm.nbplan


cdef tuple nb_agreed(Comm comm):
    """nb_plan, with the number of rounds every process runs: a distributed
    graph's is the largest of the processes' (an MPI allreduce, once: at its
    creation, or at the first blocking composed call on a copy). Called by
    every process at the same point: a non-blocking call agrees in a stage
    of its own instead (nb_staged)."""
    cdef tuple plan = nb_plan(comm)
    if plan[5] >= 0:
        return plan
    with _Window():             # (blocking in MPI: the progress engine goes on)
        return nb_set_rounds(comm, _MPI.Comm.allreduce(comm, -1 - plan[5], _mpi4py.MAX))


cdef tuple nb_set_rounds(Comm comm, int rounds):
    """Set the agreed number of rounds of `comm`'s plan; the plan."""
    cdef tuple plan = nb_plan(comm)
    comm.nbplan = plan[:5] + (rounds,) + plan[6:]
    return comm.nbplan


cdef list rounds_of(list ranks, list keys):
    """The round of each block to (or from) `ranks`: its place among the
    blocks of the same process, in the order of `keys`."""
    cdef dict same = {}
    for k, j in enumerate(ranks):
        if j != MPI_PROC_NULL:
            same.setdefault(j, []).append(k)
    out = [0] * len(ranks)
    for ks in same.values():
        for r, k in enumerate(sorted(ks, key=keys.__getitem__)):
            out[k] = r
    return out


cdef int nb_matched(Comm comm, list rounds) except -1:
    """Make each round's receive sizes those of the blocks coming, before a
    blocking call's data: a backend's all-to-all needs them exact (Gloo
    aborts the process on a longer block, and fills a shorter one's slot
    with what its buffer held), and on MPI a longer block fails one round on
    some processes only (Open MPI's libnbc). The processes swap the byte
    counts they send (an MPI alltoall), then agree whether any block is
    longer than its slot (an MPI allreduce): if so, every process raises
    MPI's truncation error before any data moves. (_NbStages does the same
    for a non-blocking call, without waiting.)"""
    if not rounds:
        return 0
    with _Window():             # (blocking in MPI: the progress engine goes on)
        got = _MPI.Comm.alltoall(comm, nb_sizes(comm.nprocs(), rounds))
        longer = nb_fit(rounds, got)
        if _MPI.Comm.allreduce(comm, longer is not None, _mpi4py.LOR):
            raise nb_truncation(longer)
    return 0


cdef int nb_sizes_agree(Comm comm, str call, tuple args) except -1:
    """Checked mode (checkimpl.pxi, once the processes agree on the call):
    before neighborhood collective `call` runs with `args` (sendbuf,
    recvbuf, ...: mpi4py's, or composed on a backend), the processes swap
    the sizes of its blocks
    (nb_matched), and every one raises MPI's truncation error if a block is
    longer than its slot, before any data moves: Open MPI writes such a
    block past its slot. A side in a derived datatype takes part with no
    size (sends -1, its slots hold anything): MPI checks those."""
    cdef int kind = NB_NAMES.index(call.partition("eighbor_")[2].removesuffix("_init"))
    cdef tuple plan = nb_agreed(comm)
    cdef _Call m = nb_msg(kind, args[0], args[1], len(plan[1]), len(plan[2]))
    cdef list rounds = nb_rounds(plan, kind, m)
    for r in rounds:
        if m.sown is not None and m.s.tindex < 0:
            r[0][:] = [-1] * len(r[0])
        if m.rown is not None and m.r.tindex < 0:
            r[2][:] = [1 << 62] * len(r[2])
    nb_matched(comm, rounds)
    return 0


cdef list nb_sizes(int size, list rounds):
    """Per process, the bytes this one sends it in each round."""
    return [[r[0][j] for r in rounds] for j in range(size)]


cdef object nb_fit(list rounds, object got):
    """Set each round's receive sizes to `got` (per process, per round: what
    it sends here); return (process, bytes, slot bytes) of a block longer
    than its slot, or None."""
    longer = None
    for i in range(len(got)):
        for k in range(len(rounds)):
            if got[i][k] > rounds[k][2][i]:
                longer = (i, got[i][k], rounds[k][2][i])
            else:
                rounds[k][2][i] = got[i][k]
    return longer


cdef object nb_truncation(object longer):
    exc = Exception(MPI_ERR_TRUNCATE)
    if longer is not None:
        add_note(exc, f"recvbuf: process {longer[0]} sends a block of {longer[1]} bytes to "
                      f"a slot of {longer[2]}")
    else:
        add_note(exc, "recvbuf: another process got a block longer than its slot")
    return exc


cdef object nb_staged(Comm comm, object sub, str name, object sbytes, object rbytes,
                      tuple plan, int kind, _Call m, list rounds, bint on_device):
    """A composed non-blocking call as a staged operation (mcr.stages), on
    the private communicators of `comm` for its backend: posted in call
    order on every process, whatever order they test it in, and driven by
    every wait of the process. Its stages: on a distributed graph not agreed
    yet, its number of rounds agreed (an MPI Iallreduce; see nb_agreed); the
    sizes swapped (an MPI Ialltoall); whether a block is too long agreed (an
    MPI Iallreduce); the rounds (see nb_matched). Their number is decided at
    the call, the same on every process (a plan is agreed only by blocking
    calls and at a distributed graph's creation)."""
    cdef bint agree = plan[5] < 0
    if not agree and not rounds:
        return _work_request(name, [_Done()], None, m)
    pipeline = _nb_pipeline(comm.nprocs(), sub is MPI_SUB, name, sbytes, rbytes, plan, kind,
                            m if agree else None, None if agree else rounds)
    flight = service("stages").launch(comm, name, 4 if agree else 3, pipeline,
                                      on_device)
    return _work_request(name, [flight], None, m)


def _nb_pipeline(int size, bint on_mpi, str name, sbytes, rbytes, tuple plan, int kind,
                 _Call m, list rounds):
    """The stages of nb_staged (a pipeline of mcr.stages): each yields the
    post of its exchange on a private communicator."""
    import numpy
    if rounds is None:          # a distributed graph's rounds: agreed first
        mine = numpy.array([-1 - plan[5]], numpy.int32)
        most = numpy.zeros(1, numpy.int32)
        yield lambda private: _MPI.Comm.Iallreduce(private, mine, most, _mpi4py.MAX)
        rounds = nb_rounds(plan[:5] + (int(most[0]),) + plan[6:], kind, m)
        m = None
        if not rounds:          # (no process has a neighbour)
            for _ in range(3):
                yield lambda private: _NOTHING
            return
    sent = numpy.array(nb_sizes(size, rounds), dtype=numpy.int64).reshape(size, len(rounds))
    got = numpy.empty_like(sent)
    yield lambda private: _MPI.Comm.Ialltoall(private, sent, got)
    longer = nb_fit(rounds, got)
    flag = numpy.array([longer is not None], numpy.int32)
    anyone = numpy.zeros(1, numpy.int32)
    yield lambda private: _MPI.Comm.Iallreduce(private, flag, anyone, _mpi4py.MAX)
    if anyone[0]:
        raise nb_truncation(longer)
    yield lambda private: _Each(nb_post_rounds(<Comm?>private, on_mpi, name, sbytes, rbytes,
                                               rounds))


cdef list nb_post_rounds(Comm private, bint on_mpi, str name, object sbytes, object rbytes,
                         list rounds):
    """Post every round on `private` (a private communicator); their Requests."""
    sub = MPI_SUB if on_mpi else private.sub(name)
    return [nb_alltoallv(private, sub, NONBLOCKING, name, [sbytes, sc, sd], [rbytes, rc, rd])
            for sc, sd, rc, rd in rounds]


cdef class _Each:
    """Requests as one stage's exchange: complete when all are."""
    cdef list requests

    def __cinit__(self, list requests):
        self.requests = requests

    def Test(self):
        while self.requests and self.requests[-1].Test():
            self.requests.pop()
        return not self.requests


cdef class _Nothing:
    """A stage with nothing to exchange."""

    def Test(self):
        return True


cdef _Nothing _NOTHING = _Nothing()


cdef list nb_rounds(tuple plan, int kind, _Call m):
    """Per round, the byte counts and displacements of an Alltoallv: (send
    counts, send displs, receive counts, receive displs)."""
    size, sources, dests, sround, rround, nrounds = plan[:6]
    if nrounds < 0:                # not agreed yet: this process's own rounds
        nrounds = -1 - nrounds
    rounds = [([0] * size, [0] * size, [0] * size, [0] * size) for _ in range(nrounds)]
    cdef Py_ssize_t se = m.s.extent, re = m.r.extent, c, d
    for k, j in enumerate(dests):
        if j == MPI_PROC_NULL:
            continue
        if kind == NB_ALLTOALLV:
            c, d = m.s.counts[k], m.s.displs[k]
        else:
            c, d = m.s.count, (k * m.s.count if kind == NB_ALLTOALL else 0)
        r = rounds[sround[k]]
        r[0][j], r[1][j] = c * se, d * se
    for k, i in enumerate(sources):
        if i == MPI_PROC_NULL:
            continue
        if kind == NB_ALLGATHER or kind == NB_ALLTOALL:
            c, d = m.r.count, k * m.r.count
        else:
            c, d = m.r.counts[k], m.r.displs[k]
        r = rounds[rround[k]]
        r[2][i], r[3][i] = c * re, d * re
    return rounds


class _Neighborhood:
    """The neighborhood collectives of mcr's topologies (neighbor.pxi): on
    MPI, MPI's own (CUDA tensors staged through host copies); on another
    backend, they are composed of its Alltoallv. Checked
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
            ``"mpi"`` (MPI's own), another backend (composed of its
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
            ``"mpi"`` (MPI's own), another backend (composed of its
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
            ``"mpi"`` (MPI's own), another backend (composed of its
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
            ``"mpi"`` (MPI's own), another backend (composed of its
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
            ``"mpi"`` (MPI's own), another backend (composed of its
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
        if nb_plan(<Comm>self)[7]:
            return (<Comm>self).made("neighbor_allgather", _obj_nb_composed,
                                     (sendobj, NB_ALLGATHER))
        return (<Comm>self).made("neighbor_allgather", _MPI.Topocomm.neighbor_allgather,
                                 (sendobj,))

    def neighbor_alltoall(self, sendobj):
        """Exchange pickled objects with every neighbour (collective); see mpi4py."""
        if nb_plan(<Comm>self)[7]:
            return (<Comm>self).made("neighbor_alltoall", _obj_nb_composed,
                                     (sendobj, NB_ALLTOALL))
        return (<Comm>self).made("neighbor_alltoall", _obj_nb_alltoall, (sendobj,))


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
# block, the non-blocking ones (Idup, Ineighbor_...) must not, and the persistent
# ones (Neighbor_..._init) wait at each Start, as Allreduce_init's
cdef tuple UNAWAITED_CALLS = ("Free", "Idup", "Idup_with_info", "Ineighbor_allgather",
                               "Ineighbor_allgatherv", "Ineighbor_alltoall",
                               "Ineighbor_alltoallv", "Ineighbor_alltoallw",
                               "Neighbor_allgather_init", "Neighbor_allgatherv_init",
                               "Neighbor_alltoall_init", "Neighbor_alltoallv_init",
                               "Neighbor_alltoallw_init")


# mpi4py's class of a topology communicator -> mcr's
cdef dict TOPOLOGY_CLASSES = {_MPI.Cartcomm: Cartcomm, _MPI.Graphcomm: Graphcomm,
                              _MPI.Distgraphcomm: Distgraphcomm}
