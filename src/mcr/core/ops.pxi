# The operations of the buffer methods: for each, how to parse its arguments
# (parse_*), how to post it on MPI (mpi_*, the C call in dispatch.h with the
# GIL released) and how to post it on a backend's Subcomm (sub_*), gathered in
# the descriptor table OP_TABLE (calls.pxi) at import. Comm.call runs a _Call
# through them; adding an operation is one row here, its functions, and its
# methods in Comm.pyx (see the Architecture page).
#
# A parser checks every argument and fills the call's sides, ranks and tags;
# it communicates with nothing. A poster runs once the call is parsed, staged
# (staging.pxi) and chosen (auto.pxi).


# -- Point-to-point -------------------------------------------------------------

cdef int parse_send(Comm comm, _Call c) except -1:
    comm.prologue(None)
    c.idest = as_rank(c.dest, comm.nprocs(), b"dest", True)
    c.itag = as_tag(c.tag, b"tag", False)
    c.sown = parse_simple(c.sendbuf, &c.s, False, b"buf")
    return 0


cdef int mpi_send(Comm comm, _Call c, int form, MPI_Info info, MPI_Request *req) except -1:
    cdef int ierr, send_mode = OP_TABLE[c.op].variant
    with nogil:
        ierr = mcr_send_in(send_mode, form, c.s.addr, c.s.count, c.s.dtype, c.idest, c.itag,
                           comm.ob_mpi, req)
    CHKERR(ierr)
    return 0


cdef object sub_send(object sub, _Call c):
    cdef int send_mode = OP_TABLE[c.op].variant
    if send_mode == STANDARD:
        return sub.send(c, dest=c.idest, tag=c.itag)
    if send_mode == BUFFERED:
        return sub.bsend(c, dest=c.idest, tag=c.itag)
    if send_mode == SYNCHRONOUS:
        return sub.ssend(c, dest=c.idest, tag=c.itag)
    return sub.rsend(c, dest=c.idest, tag=c.itag)


cdef int parse_recv(Comm comm, _Call c) except -1:
    comm.prologue(None)
    c.isource = as_source(c.source, comm.nprocs())
    c.itag = as_tag(c.tag, b"tag", True)
    c.rown = parse_simple(c.recvbuf, &c.r, True, b"buf")
    if c.form == BLOCKING:
        check_status(c.status)        # before the receive takes a message
    return 0


cdef int mpi_recv(Comm comm, _Call c, int form, MPI_Info info, MPI_Request *req) except -1:
    cdef MPI_Status *sp = status_ptr(c.status)
    cdef MPI_Status own
    if sp == MPI_STATUS_IGNORE:
        sp = &own                     # it explains a truncation
    cdef int ierr
    with nogil:
        ierr = mcr_recv(form, c.r.addr, c.r.count, c.r.dtype, c.isource, c.itag, comm.ob_mpi,
                        sp, req)
    status_type(c.status, c.r.dtype)     # (a truncated message is counted in it too)
    if ierr != MPI_SUCCESS:
        raise_recv_error(ierr, sp, &c.r, "buf")
    return 0


cdef object sub_recv(object sub, _Call c):
    return sub.recv(c, source=c.isource, tag=c.itag)


cdef int parse_sendrecv(Comm comm, _Call c) except -1:
    # Sendrecv, or Sendrecv_replace (variant 1: recvbuf is sent, then received into)
    cdef bint replace = OP_TABLE[c.op].variant
    comm.prologue(None)
    c.idest = as_rank(c.dest, comm.nprocs(), b"dest", True)
    c.isource = as_source(c.source, comm.nprocs())
    c.itag = as_tag(c.tag, b"sendtag", False)
    c.irecvtag = as_tag(c.recvtag, b"recvtag", True)
    if not replace:
        c.sown = parse_simple(c.sendbuf, &c.s, False, b"sendbuf")
    c.rown = parse_simple(c.recvbuf, &c.r, True, b"buf" if replace else b"recvbuf")
    if not replace:
        check_apart(&c.s, &c.r, 1, 1, False, b"Sendrecv_replace")
    if c.form == BLOCKING:
        check_status(c.status)
    return 0


cdef int mpi_sendrecv(Comm comm, _Call c, int form, MPI_Info info,
                      MPI_Request *req) except -1:
    # blocking, or non-blocking (MPI-4's Isendrecv, or composed where missing)
    cdef bint replace = OP_TABLE[c.op].variant
    if form == NONBLOCKING and compose_isendrecv():
        c.parts = isendrecv_parts(c, c.idest, c.itag, c.isource, c.irecvtag, comm.ob_mpi,
                                  replace)
        return 0
    cdef MPI_Status *sp = status_ptr(c.status)
    cdef MPI_Status own
    if sp == MPI_STATUS_IGNORE:
        sp = &own
    cdef int ierr
    with nogil:
        if replace:
            ierr = mcr_sendrecv_replace(form, c.r.addr, c.r.count, c.r.dtype, c.idest, c.itag,
                                        c.isource, c.irecvtag, comm.ob_mpi, sp, req)
        else:
            ierr = mcr_sendrecv(form, c.s.addr, c.s.count, c.s.dtype, c.idest, c.itag,
                                c.r.addr, c.r.count, c.r.dtype, c.isource, c.irecvtag,
                                comm.ob_mpi, sp, req)
    status_type(c.status, c.r.dtype)
    if ierr != MPI_SUCCESS:
        raise_recv_error(ierr, sp, &c.r, "buf" if replace else "recvbuf")
    return 0


cdef object sub_sendrecv(object sub, _Call c):
    if OP_TABLE[c.op].variant:
        return sub.sendrecv_replace(c, dest=c.idest, sendtag=c.itag, source=c.isource,
                                    tag=c.irecvtag)
    return sub.sendrecv(c, dest=c.idest, sendtag=c.itag, source=c.isource, tag=c.irecvtag)


# -- Collectives ----------------------------------------------------------------

cdef int parse_barrier(Comm comm, _Call c) except -1:
    comm.prologue(None)
    return 0


cdef int mpi_barrier(Comm comm, _Call c, int form, MPI_Info info, MPI_Request *req) except -1:
    cdef int ierr
    with nogil:
        ierr = mcr_barrier(form, comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_barrier(object sub, _Call c):
    return sub.barrier(c)


cdef int parse_bcast(Comm comm, _Call c) except -1:
    comm.prologue(None)
    cdef int size = comm.nprocs()
    c.iroot = as_rank(c.root, size, b"root", False)
    c.for_bcast(c.recvbuf, c.iroot, comm.myrank(), size)
    return 0


cdef int mpi_bcast(Comm comm, _Call c, int form, MPI_Info info, MPI_Request *req) except -1:
    cdef int ierr
    with nogil:
        ierr = mcr_bcast(form, c.r.addr, c.r.count, c.r.dtype, c.iroot, comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_bcast(object sub, _Call c):
    return sub.bcast(c, root=c.iroot)


cdef int parse_gather(Comm comm, _Call c) except -1:
    # Gather, Gatherv (variant 1)
    comm.prologue(None)
    cdef int size = comm.nprocs()
    c.iroot = as_rank(c.root, size, b"root", False)
    c.for_gather(c.sendbuf, c.recvbuf, c.iroot, comm.myrank(), size, OP_TABLE[c.op].variant)
    c.rblocks = size
    return 0


cdef int mpi_gather(Comm comm, _Call c, int form, MPI_Info info, MPI_Request *req) except -1:
    cdef int ierr
    cdef bint v = OP_TABLE[c.op].variant
    with nogil:
        if v:
            ierr = mcr_gatherv(form, c.s.addr, c.s.count, c.s.dtype, c.r.addr, c.r.counts,
                               c.r.displs, c.r.dtype, c.iroot, comm.ob_mpi, info, req)
        else:
            ierr = mcr_gather(form, c.s.addr, c.s.count, c.s.dtype, c.r.addr, c.r.count,
                              c.r.dtype, c.iroot, comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_gather(object sub, _Call c):
    if OP_TABLE[c.op].variant:
        return sub.gatherv(c, root=c.iroot)
    return sub.gather(c, root=c.iroot)


cdef int parse_scatter(Comm comm, _Call c) except -1:
    # Scatter, Scatterv (variant 1)
    comm.prologue(None)
    cdef int size = comm.nprocs()
    c.iroot = as_rank(c.root, size, b"root", False)
    c.for_scatter(c.sendbuf, c.recvbuf, c.iroot, comm.myrank(), size, OP_TABLE[c.op].variant)
    c.sblocks = size
    return 0


cdef int mpi_scatter(Comm comm, _Call c, int form, MPI_Info info, MPI_Request *req) except -1:
    cdef int ierr
    cdef bint v = OP_TABLE[c.op].variant
    with nogil:
        if v:
            ierr = mcr_scatterv(form, c.s.addr, c.s.counts, c.s.displs, c.s.dtype, c.r.addr,
                                c.r.count, c.r.dtype, c.iroot, comm.ob_mpi, info, req)
        else:
            ierr = mcr_scatter(form, c.s.addr, c.s.count, c.s.dtype, c.r.addr, c.r.count,
                               c.r.dtype, c.iroot, comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_scatter(object sub, _Call c):
    if OP_TABLE[c.op].variant:
        return sub.scatterv(c, root=c.iroot)
    return sub.scatter(c, root=c.iroot)


cdef int parse_allgather(Comm comm, _Call c) except -1:
    # Allgather, Allgatherv (variant 1)
    comm.prologue(None)
    c.for_allgather(c.sendbuf, c.recvbuf, comm.myrank(), comm.nprocs(), OP_TABLE[c.op].variant)
    c.rblocks = comm.nprocs()
    return 0


cdef int mpi_allgather(Comm comm, _Call c, int form, MPI_Info info,
                       MPI_Request *req) except -1:
    cdef int ierr
    cdef bint v = OP_TABLE[c.op].variant
    with nogil:
        if v:
            ierr = mcr_allgatherv(form, c.s.addr, c.s.count, c.s.dtype, c.r.addr, c.r.counts,
                                  c.r.displs, c.r.dtype, comm.ob_mpi, info, req)
        else:
            ierr = mcr_allgather(form, c.s.addr, c.s.count, c.s.dtype, c.r.addr, c.r.count,
                                 c.r.dtype, comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_allgather(object sub, _Call c):
    if OP_TABLE[c.op].variant:
        return sub.allgatherv(c)
    return sub.allgather(c)


cdef int parse_alltoall(Comm comm, _Call c) except -1:
    # Alltoall, Alltoallv (variant 1)
    comm.prologue(None)
    c.for_alltoall(c.sendbuf, c.recvbuf, comm.nprocs(), OP_TABLE[c.op].variant)
    c.sblocks = c.rblocks = comm.nprocs()
    return 0


cdef int mpi_alltoall(Comm comm, _Call c, int form, MPI_Info info,
                      MPI_Request *req) except -1:
    cdef int ierr
    cdef bint v = OP_TABLE[c.op].variant
    with nogil:
        if v:
            ierr = mcr_alltoallv(form, c.s.addr, c.s.counts, c.s.displs, c.s.dtype, c.r.addr,
                                 c.r.counts, c.r.displs, c.r.dtype, comm.ob_mpi, info, req)
        else:
            ierr = mcr_alltoall(form, c.s.addr, c.s.count, c.s.dtype, c.r.addr, c.r.count,
                                c.r.dtype, comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_alltoall(object sub, _Call c):
    if OP_TABLE[c.op].variant:
        return sub.alltoallv(c)
    return sub.alltoall(c)


cdef int parse_alltoallw(Comm comm, _Call c) except -1:
    comm.prologue(None)
    cdef _MsgW w = _MsgW.__new__(_MsgW)
    w.for_alltoallw(c.sendbuf, c.recvbuf, comm.nprocs())
    c.w = w
    return 0


cdef int mpi_alltoallw(Comm comm, _Call c, int form, MPI_Info info,
                       MPI_Request *req) except -1:
    cdef _MsgW w = <_MsgW>c.w
    if comm.nprocs() == 1:
        w.move_own_block(comm.ob_mpi)
    cdef int ierr
    with nogil:
        ierr = mcr_alltoallw(form, w.saddr, w.scounts, w.sdispls, w.stypes, w.raddr,
                             w.rcounts, w.rdispls, w.rtypes, comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_none(object sub, _Call c):
    raise ValueError(f"{method_name(c.op, c.form)}: backend {sub.name!r} cannot run it (one "
                     "MPI datatype per process); use backend='mpi'")


cdef int parse_reduce(Comm comm, _Call c) except -1:
    comm.prologue(None)
    cdef int size = comm.nprocs()
    c.iroot = as_rank(c.root, size, b"root", False)
    c.for_reduce(c.sendbuf, c.recvbuf, c.iroot, comm.myrank(), size)
    # the operand's side: the receive side when the root reduces in place
    resolve_op(c.redop, &c.r if c.s.addr == <char*>MPI_IN_PLACE else &c.s, &c.mop)
    return 0


cdef int mpi_reduce(Comm comm, _Call c, int form, MPI_Info info, MPI_Request *req) except -1:
    cdef side *x = &c.r if c.s.addr == <char*>MPI_IN_PLACE else &c.s
    cdef int ierr
    with nogil:
        ierr = mcr_reduce(form, c.s.addr, c.r.addr, x.count, x.dtype, c.mop, c.iroot,
                          comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_reduce(object sub, _Call c):
    return sub.reduce(c, op=c.redop, root=c.iroot)


cdef int parse_allreduce(Comm comm, _Call c) except -1:
    # Allreduce, Scan, Exscan: the same message shape
    comm.prologue(None)
    c.for_allreduce(c.sendbuf, c.recvbuf)
    resolve_op(c.redop, &c.r, &c.mop)
    return 0


cdef int mpi_allreduce(Comm comm, _Call c, int form, MPI_Info info,
                       MPI_Request *req) except -1:
    cdef int ierr, op = c.op
    with nogil:
        if op == CALL_ALLREDUCE:
            ierr = mcr_allreduce(form, c.s.addr, c.r.addr, c.r.count, c.r.dtype, c.mop,
                                 comm.ob_mpi, info, req)
        elif op == CALL_SCAN:
            ierr = mcr_scan(form, c.s.addr, c.r.addr, c.r.count, c.r.dtype, c.mop, comm.ob_mpi,
                            info, req)
        else:
            ierr = mcr_exscan(form, c.s.addr, c.r.addr, c.r.count, c.r.dtype, c.mop,
                              comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef object sub_allreduce(object sub, _Call c):
    if c.op == CALL_ALLREDUCE:
        return sub.allreduce(c, op=c.redop)
    if c.op == CALL_SCAN:
        return sub.scan(c, op=c.redop)
    return sub.exscan(c, op=c.redop)


cdef int parse_reduce_scatter(Comm comm, _Call c) except -1:
    # Reduce_scatter_block (variant 1), Reduce_scatter
    comm.prologue(None)
    cdef bint block = OP_TABLE[c.op].variant
    if block:
        c.for_reduce_scatter_block(c.sendbuf, c.recvbuf, comm.nprocs())
        if c.s.addr == <char*>MPI_IN_PLACE:
            c.rblocks = comm.nprocs()   # in place, the input is the whole of recvbuf
    else:
        c.for_reduce_scatter(c.sendbuf, c.recvbuf, c.recvcounts, comm.myrank(), comm.nprocs(),
                             comm.ob_mpi)
    resolve_op(c.redop, &c.r, &c.mop)
    return 0


cdef int mpi_reduce_scatter(Comm comm, _Call c, int form, MPI_Info info,
                            MPI_Request *req) except -1:
    cdef int ierr
    cdef bint block = OP_TABLE[c.op].variant
    cdef char *send = c.s.addr
    cdef bint host = c.r.device < 0 or c.staged is not None      # (a CUDA-aware MPI's: left)
    if not block and host and mpich_copies_onto_itself(comm, c):
        c.scratch = PyBytes_FromStringAndSize(c.r.addr, <Py_ssize_t>c.r.count * c.r.extent)
        send = PyBytes_AS_STRING(c.scratch)
    with nogil:
        if block:
            ierr = mcr_reduce_scatter_block(form, send, c.r.addr, c.r.count, c.r.dtype,
                                            c.mop, comm.ob_mpi, info, req)
        else:
            ierr = mcr_reduce_scatter(form, send, c.r.addr, c.r.counts, c.r.dtype, c.mop,
                                      comm.ob_mpi, info, req)
    CHKERR(ierr)
    return 0


cdef bint mpich_copies_onto_itself(Comm comm, _Call c) except -1:
    """Whether MPICH would copy a process's result onto itself: its
    Reduce_scatter in place (every form, 5.0.2, from about 512 KiB) moves the
    result from the process's block to the start of recvbuf with memcpy, and
    aborts ("memcpy argument memory ranges overlap") where the block starts
    before its own length ends. mcr then passes a copy of the input instead
    of IN_PLACE, and emulates the persistent form, to copy at each start: on
    every process alike (the counts are the same on all), since persistent
    collectives must match."""
    cdef int i
    cdef Py_ssize_t start = 0
    if c.s.addr != <char*>MPI_IN_PLACE or not library_is_mpich():
        return False
    for i in range(comm.nprocs()):
        if 0 < start < c.r.counts[i]:
            return True
        start += c.r.counts[i]
    return False


cdef object sub_reduce_scatter(object sub, _Call c):
    if OP_TABLE[c.op].variant:
        return sub.reduce_scatter_block(c, op=c.redop)
    return sub.reduce_scatter(c, op=c.redop)


# -- The table ------------------------------------------------------------------

cdef int define(int op, int flags, int variant, tuple args, parse_fn parse, mpi_fn post_mpi,
                sub_fn post_sub) except -1:
    cdef OpDesc *d = &OP_TABLE[op]
    d.flags, d.variant, d.nargs = flags, variant, len(args)
    for i in range(len(args)):
        d.args[i] = args[i]
    d.parse, d.post_mpi, d.post_sub = parse, post_mpi, post_sub
    return 0


cdef int define_ops() except -1:
    cdef int P2P = OP_P2P, RECV = OP_P2P | OP_RECEIVES, ZIP = OP_COMPRESSIBLE
    # not Bcast, Exscan (rank 0's is left), Reduce_scatter (recvbuf may be longer), nor
    # Scatter(v) (a process's count is its buffer's, checked against no other)
    cdef int FILLS = OP_COMPRESSIBLE | OP_FILLS
    cdef tuple SEND = (A_SENDBUF, A_DEST, A_TAG)
    cdef tuple SR = (A_SENDBUF, A_RECVBUF)
    cdef tuple ROOTED = (A_SENDBUF, A_RECVBUF, A_ROOT)
    cdef tuple REDUCING = (A_SENDBUF, A_RECVBUF, A_OP)
    define(CALL_SEND, P2P, STANDARD, SEND, parse_send, mpi_send, sub_send)
    define(CALL_BSEND, P2P, BUFFERED, SEND, parse_send, mpi_send, sub_send)
    define(CALL_SSEND, P2P, SYNCHRONOUS, SEND, parse_send, mpi_send, sub_send)
    define(CALL_RSEND, P2P, READY, SEND, parse_send, mpi_send, sub_send)
    define(CALL_RECV, RECV, 0, (A_RECVBUF, A_SOURCE, A_TAG, A_STATUS), parse_recv, mpi_recv,
           sub_recv)
    define(CALL_SENDRECV, RECV | OP_NO_PERSISTENT, 0,
           (A_SENDBUF, A_DEST, A_TAG, A_RECVBUF, A_SOURCE, A_RECVTAG, A_STATUS),
           parse_sendrecv, mpi_sendrecv, sub_sendrecv)
    define(CALL_SENDRECV_REPLACE, RECV | OP_NO_PERSISTENT, 1,
           (A_RECVBUF, A_DEST, A_TAG, A_SOURCE, A_RECVTAG, A_STATUS),
           parse_sendrecv, mpi_sendrecv, sub_sendrecv)
    define(CALL_BARRIER, 0, 0, (), parse_barrier, mpi_barrier, sub_barrier)
    define(CALL_BCAST, ZIP | OP_ROOTED, 0, (A_RECVBUF, A_ROOT), parse_bcast, mpi_bcast,
           sub_bcast)
    define(CALL_GATHER, FILLS | OP_ROOTED, 0, ROOTED, parse_gather, mpi_gather, sub_gather)
    define(CALL_GATHERV, FILLS | OP_ROOTED, 1, ROOTED, parse_gather, mpi_gather, sub_gather)
    define(CALL_SCATTER, ZIP | OP_ROOTED, 0, ROOTED, parse_scatter, mpi_scatter, sub_scatter)
    define(CALL_SCATTERV, ZIP | OP_ROOTED, 1, ROOTED, parse_scatter, mpi_scatter, sub_scatter)
    define(CALL_ALLGATHER, FILLS, 0, SR, parse_allgather, mpi_allgather, sub_allgather)
    define(CALL_ALLGATHERV, FILLS, 1, SR, parse_allgather, mpi_allgather, sub_allgather)
    define(CALL_ALLTOALL, FILLS, 0, SR, parse_alltoall, mpi_alltoall, sub_alltoall)
    define(CALL_ALLTOALLV, FILLS, 1, SR, parse_alltoall, mpi_alltoall, sub_alltoall)
    define(CALL_ALLTOALLW, OP_MPI_ONLY, 0, SR, parse_alltoallw, mpi_alltoallw, sub_none)
    define(CALL_REDUCE, FILLS | OP_ROOTED, 0, (A_SENDBUF, A_RECVBUF, A_OP, A_ROOT),
           parse_reduce, mpi_reduce, sub_reduce)
    define(CALL_ALLREDUCE, FILLS, 0, REDUCING, parse_allreduce, mpi_allreduce, sub_allreduce)
    define(CALL_SCAN, OP_FILLS, 0, REDUCING, parse_allreduce, mpi_allreduce, sub_allreduce)
    define(CALL_EXSCAN, 0, 0, REDUCING, parse_allreduce, mpi_allreduce, sub_allreduce)
    define(CALL_REDUCE_SCATTER_BLOCK, FILLS, 1, REDUCING, parse_reduce_scatter,
           mpi_reduce_scatter, sub_reduce_scatter)
    define(CALL_REDUCE_SCATTER, ZIP, 0, (A_SENDBUF, A_RECVBUF, A_RECVCOUNTS, A_OP),
           parse_reduce_scatter, mpi_reduce_scatter, sub_reduce_scatter)
    # the neighbourhood collectives: seen by the interceptors, run by neighbor.pxi
    for kind in range(SEEN_COUNT - CALL_COUNT):
        define(CALL_COUNT + kind, OP_NEIGHBOR, 0, SR, NULL, NULL, NULL)
    # the calls outside the buffer methods: run by their mpi4py function
    define(COMM_OP, OP_COMM, 0, (), NULL, NULL, NULL)
    define(COMM_P2P_OP, OP_COMM | OP_P2P, 0, (), NULL, NULL, NULL)
    return 0


define_ops()
