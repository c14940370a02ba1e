# The communication logger's records (mcr.log is its Python side). While it is
# on, its interceptor (_Logger, on every communicator's chain) makes one _Rec
# per call: what the call moves, read from its parsed message, and when it
# was posted and completed. A blocking call completes when it returns; a
# non-blocking one when Wait, Test or a Request class method reports it (the
# record is the request's observer); a persistent one at each Start (the
# interceptor's on_start) and its completion. Finished records are added to
# per-(op, backend, size) totals here; when records are kept (json and trace
# output), they are also handed to mcr.log in batches. Nothing here
# synchronizes: the times are the host's clock at post and at completion as
# the program sees it (CUDA calls are timed by events, in mcr.log).

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef bint log_on = False       # logging is on (the logger's interceptor applies)
cdef bint log_keep = False     # keep every record, not only the totals
cdef object log_sink = None    # mcr.log's sink: takes batches, times CUDA calls
cdef list log_records = []     # finished records not yet handed to the sink
cdef dict log_totals = {}      # (op, backend, bytes, comm size) -> _Total
cdef Py_ssize_t LOG_BATCH = 4096
cdef _Rec last_rec = None      # the record last added to the totals, and its total:
cdef object last_total = None  # a loop of the same call skips the dictionary


cdef inline long long now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000LL + ts.tv_nsec


cdef inline long long deadline_ns(double seconds) noexcept nogil:
    """now_ns() `seconds` from now; a limit beyond 30 years is 30 years (a
    larger one, 1e10 s, would overflow the nanoseconds into the past)."""
    return now_ns() + <long long>(min(seconds, 1e9) * 1e9)


@cython.final
cdef class _Rec(_Observer):
    """One call as the logger records it (mcr.log turns it into a dict);
    the observer of a non-blocking call's request."""
    cdef readonly int op           # index into SEEN_NAMES
    cdef readonly int form         # BLOCKING, NONBLOCKING, PERSISTENT
    cdef readonly str backend
    cdef readonly object why       # auto: (table, source, device, key bytes); else None
    cdef readonly long long nbytes  # the message size, as nccl-tests counts it (mcr.log)
    cdef public long long wire     # bytes this process put on the wire (compression)
    cdef readonly long long count  # elements
    cdef readonly str dtype
    cdef readonly int peer         # root, destination or source; -1: none
    cdef readonly int tag          # point-to-point tag; -1: none
    cdef readonly int device       # CUDA device of the buffers, -1: host memory
    cdef readonly Py_ssize_t comm  # the MPI communicator handle
    cdef readonly int size         # its number of processes
    cdef public long long t0       # posted (ns, CLOCK_MONOTONIC)
    cdef public long long t1       # completed
    cdef public object cuda        # mcr.log's CUDA events of a call on the device

    cdef bint ended(self, int how) except -1:
        # completed: the record completes now (one freed or dropped before, or
        # failed, is not recorded)
        if how == OBS_DONE:
            self.t1 = now_ns()
            if log_on:
                log_finish(self)
        return False

    def set_wire(self, nbytes):
        """Record the bytes put on the wire (mcr.compress)."""
        self.wire = nbytes

    @property
    def op_name(self):
        return SEEN_NAMES[self.op]

    @property
    def form_name(self):
        return FORM_NAMES[self.form]


@cython.final
cdef class _Total:
    """The calls of one (op, backend, bytes): how many, and their times."""
    cdef long long calls, total_ns, min_ns, max_ns, wire

    cdef inline void add(self, _Rec r) noexcept:
        cdef long long t = r.t1 - r.t0
        if self.calls == 0 or t < self.min_ns:
            self.min_ns = t
        if t > self.max_ns:
            self.max_ns = t
        self.calls += 1
        self.total_ns += t
        self.wire += r.wire


cdef _Rec log_post(Comm comm, int op, int form, str backend, object m, object why):
    """The record of a call posted now, described from the parsed call `m`
    (its sides, and its peer or root and tag); `op` indexes SEEN_NAMES (a
    neighborhood collective: described by nb_describe from its message `m`,
    None for derived datatypes)."""
    cdef _Rec r = _Rec.__new__(_Rec)
    r.t0 = now_ns()
    r.op, r.form, r.backend, r.why = op, form, backend, why
    r.comm = <Py_ssize_t>comm.ob_mpi
    r.size = comm.nprocs()
    r.peer = r.tag = r.device = -1
    if op >= CALL_COUNT:
        nb_describe(r, comm, op - CALL_COUNT, m)
    else:
        describe_call(r, comm, <_Call>m)
    r.wire = r.nbytes
    if r.device >= 0 and log_sink is not None:
        r.cuda = log_sink.cuda_post(r)
    return r


cdef int describe_call(_Rec r, Comm comm, _Call c) except -1:
    """Set the peer (or root) and tag of `r`, and what describe sets."""
    cdef int op = c.op
    if OP_TABLE[op].flags & OP_P2P:               # the peer (a Sendrecv's destination), the tag
        r.peer = c.source if op == CALL_RECV else c.dest
        r.tag = c.tag
    elif OP_TABLE[op].flags & OP_ROOTED:
        r.peer = c.root
    if op == CALL_ALLTOALLW:
        r.dtype = "derived"
    elif op == CALL_BARRIER:
        r.dtype = ""
    else:
        describe(r, op, c, r.size,
                 r.peer >= 0 and op >= CALL_BCAST and comm.myrank() == r.peer)
    return 0


cdef inline long long total(side *x, int size) noexcept:
    """Elements of a vector side (every process's count)."""
    cdef long long n = 0
    cdef int i
    if x.counts == NULL:
        return <long long>x.count * size
    for i in range(size):
        n += x.counts[i]
    return n


cdef int describe(_Rec r, int op, _Call m, int size, bint root) except -1:
    """Set the size, count, element type and device of `r` from `m`. The size
    is nccl-tests': the vector of a reduction or broadcast, the whole result
    of a gather, the whole input of a scatter, reduce-scatter or all-to-all;
    for the v-variants, this process's total (at the root of Gatherv and
    Scatterv, the whole)."""
    cdef side *x = &m.r
    cdef long long n = 0
    in_place_s = m.s.addr == <char*>MPI_IN_PLACE
    if op <= CALL_RSEND or op == CALL_SENDRECV:        # sends
        x = &m.s
        n = x.count
    elif op == CALL_BARRIER:
        n = 0
    elif op == CALL_RECV or op == CALL_SENDRECV_REPLACE or op == CALL_BCAST:
        n = x.count
    elif op == CALL_REDUCE or op == CALL_ALLREDUCE or op == CALL_SCAN or op == CALL_EXSCAN:
        if op == CALL_REDUCE and not in_place_s:
            x = &m.s
        n = x.count
    elif op == CALL_GATHER or op == CALL_ALLGATHER or op == CALL_ALLTOALL \
            or op == CALL_REDUCE_SCATTER_BLOCK:
        if op == CALL_GATHER and not root:
            x = &m.s
        n = <long long>x.count * size
    elif op == CALL_SCATTER:
        x = &m.s if root or m.r.addr == <char*>MPI_IN_PLACE else &m.r
        n = <long long>x.count * size
    elif op == CALL_GATHERV:
        if root:
            n = total(x, size)
        else:
            x = &m.s
            n = x.count
    elif op == CALL_SCATTERV:
        if root:
            x = &m.s
            n = total(x, size)
        else:
            n = x.count
    elif op == CALL_ALLGATHERV or op == CALL_REDUCE_SCATTER:
        n = total(x, size)
    elif op == CALL_ALLTOALLV:
        if not in_place_s:
            x = &m.s
        n = total(x, size)
    r.count = n
    r.nbytes = n * x.extent
    r.dtype = TYPE_NAMES[x.tindex] if x.tindex >= 0 else ("derived" if x.addr != NULL else "")
    if m.s.addr != NULL and m.s.device >= 0:
        r.device = m.s.device
    elif m.r.addr != NULL and m.r.device >= 0:
        r.device = m.r.device
    return 0


cdef int log_finish(_Rec r) except -1:
    """`r` has completed (r.t1 set): add it to the totals, keep it if asked."""
    if r.cuda is not None:
        log_sink.cuda_done(r)      # timed by its events once they have run
        return 0
    global last_rec, last_total
    cdef _Rec p = last_rec
    if p is not None and p.op == r.op and p.nbytes == r.nbytes and p.size == r.size \
            and p.backend is r.backend:
        t = last_total
    else:
        key = (r.op, r.backend, r.nbytes, r.size)
        t = log_totals.get(key)
        if t is None:
            t = log_totals[key] = _Total.__new__(_Total)
        last_total = t
    last_rec = r
    (<_Total>t).add(r)
    if log_keep:
        log_records.append(r)
        if len(log_records) >= LOG_BATCH:
            log_sink.take(_log_take())
    return 0


cdef _Rec rec_of(Request req):
    """The logger's record among `req`'s observers, or None."""
    cdef _Observer o = req.obs
    while o is not None and type(o) is not _Rec:
        o = o.next_obs
    return <_Rec>o


cdef _Rec take_rec(Request req):
    """The logger's record of `req`, taken off its observers (None: none)."""
    cdef _Rec r = rec_of(req)
    cdef _Observer o
    if r is None:
        return None
    if req.obs is r:
        req.obs = r.next_obs
    else:
        o = req.obs
        while o.next_obs is not r:
            o = o.next_obs
        o.next_obs = r.next_obs
    r.next_obs = None
    return r


cdef int note_wire(Request req, object nbytes) except -1:
    """The bytes the current start of `req` put on the wire (mcr.compress)."""
    cdef _Rec r = rec_of(req)
    if r is not None:
        r.wire = nbytes
    return 0


def _log_set(bint on, bint keep, sink):
    """Turn the logger on or off (mcr.log.start/stop); `keep`: keep every
    record; `sink`: mcr.log's object taking batches and timing CUDA calls."""
    global log_on, log_keep, log_sink
    log_on, log_keep, log_sink = on, keep, sink
    settings_changed()


def _log_take():
    """The finished records kept since the last take (and forget them)."""
    global log_records
    taken, log_records = log_records, []
    return taken


def _log_totals():
    """{(op name, backend, bytes, comm size): (calls, total ns, min ns, max ns,
    wire bytes)}."""
    cdef _Total t
    out = {}
    for key, value in log_totals.items():
        t = <_Total>value
        out[(SEEN_NAMES[key[0]], key[1], key[2], key[3])] = (t.calls, t.total_ns, t.min_ns,
                                                             t.max_ns, t.wire)
    return out


def _log_reset():
    """Forget every total and kept record."""
    global last_rec, last_total
    last_rec = last_total = None
    log_totals.clear()
    del log_records[:]


def _log_finish(_Rec r):
    """Complete `r` (mcr.log, once a CUDA call's events have run)."""
    r.cuda = None
    log_finish(r)


def _log_now():
    """The logger's clock (ns)."""
    return now_ns()


@cython.final
cdef class _Logger(Interceptor):
    """The logger's record of each call: made as it is posted (the parsed
    call describes it), finished now for a blocking call, handed to the
    Request of a non-blocking one; a persistent request makes one at each
    Start. mcr's private communicators are not logged."""

    cdef bint applies_to(self, Comm comm) except -1:
        return log_on and not comm.unlogged

    cdef object run_call(self, Comm comm, _Call c, Py_ssize_t i):
        if c.form == PERSISTENT or OP_TABLE[c.op].flags & OP_COMM:
            return proceed(comm, c, i + 1)
        cdef long long t0 = now_ns()
        cdef _Rec r
        if c.op >= CALL_COUNT:
            r = log_post(comm, c.op, c.form, c.name, nb_log_msg(comm, c), None)
        else:
            comm.parse(c)
            r = log_post(comm, c.op, c.form, c.name, c, c.why)
        r.t0 = t0
        c.rec = r
        result = proceed(comm, c, i + 1)
        if c.form == BLOCKING:
            r.t1 = now_ns()
            log_finish(r)
        else:
            observe(<Request>result, r)
        return result

    cdef int on_start(self, object preq, Request inner, long long t0) except -1:
        # the start's record: that of the I- form the start function posted,
        # or one made here (MPI's persistent request; a start function that
        # posts nothing logged: mcr.compress)
        cdef Prequest p = <Prequest>preq
        cdef _Rec r = take_rec(inner) if inner is not None else None
        if r is not None:
            r.form = PERSISTENT
        elif p.op:
            r = log_post(<Comm>p.comm, p.op - 1, PERSISTENT, p.backend or "mpi", p.keep,
                         (<_Call>p.keep).why if isinstance(p.keep, _Call) else None)
            if inner is not None:
                r.t0 = t0
        else:
            return 0
        observe(p, r)
        return 0


_register(_Logger(60, "logger"))
