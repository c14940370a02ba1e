# backend="auto": the backend a collective runs on, from a tuning table
# (mcr.tuning). The table is turned once per communicator into C arrays of
# size bounds, so a choice is a short loop over at most a few ranges. A
# collective under auto is parsed as usual; once parsed, Comm.chosen_other()
# asks the table, and the call is posted on MPI or on the chosen backend.
# Either way the message is parsed once.

from libc.limits cimport LLONG_MAX

cdef enum:
    AUTO_RANGES = 64      # size ranges per operation and device

cdef object AUTO_SUB = object()  # Comm.sub's answer for backend="auto"
cdef str AUTO_NAME = "auto"      # the default backend "auto", as Comm keeps it (one identity test)
cdef object _tuning = None       # mcr.tuning (services.pxi), at the first auto call


cdef object tuning_module():
    global _tuning
    if _tuning is None:
        _tuning = service("tuning")
    return _tuning


cdef object _auto_keyval = None


cdef object auto_keyval():
    global _auto_keyval
    if _auto_keyval is None:
        # no copy function: a duplicate agrees on its own table at first use
        _auto_keyval = _mpi4py.Comm.Create_keyval()
    return _auto_keyval


@cython.final
@cython.auto_pickle(False)
cdef class _Chooser:
    """What auto decides on one communicator, from one table."""
    cdef int nranges[CALL_COUNT][2]
    cdef long long bound[CALL_COUNT][2][AUTO_RANGES]      # inclusive upper bounds
    cdef unsigned char pick[CALL_COUNT][2][AUTO_RANGES]   # index into names
    cdef tuple names             # the backends chosen anywhere; "mpi" is 0
    cdef object table            # the mcr.tuning.Table, or None for the defaults
    cdef str source              # its file, or "defaults"
    cdef object error            # why the table cannot be used (agreed, then raised)
    cdef bint agreed             # every rank has the same (agree())
    cdef object meeting          # the agreement's barrier, while it waits (a timeout keeps it)
    cdef int last                # the backend of the latest choice
    cdef int last_dev            # ... the device it was made for (0 host, 1 CUDA)
    cdef long long last_key      # ... and the size (auto_key)

    cdef inline int lookup(self, int op, int dev, long long nbytes) noexcept:
        cdef int i = 0
        cdef int last = self.nranges[op][dev] - 1
        while i < last and nbytes > self.bound[op][dev][i]:
            i += 1
        return self.pick[op][dev][i]

    cdef tuple why(self):
        """What decided the latest choice, for the logger: (table, source,
        device index, size)."""
        return (self.table, self.source, self.last_dev, self.last_key)

    cdef int fill(self) except -1:
        """Set the ranges from the table (or the defaults)."""
        tuning = tuning_module()
        cdef int op, dev, i
        for op in range(CALL_COUNT):
            for dev in range(2):
                self.nranges[op][dev] = 1
                self.bound[op][dev][0] = LLONG_MAX
                self.pick[op][dev][0] = 0
        names = ["mpi"]
        for (opname, device), ranges in tuning.plan(self.table).items():
            op = CALL_NAMES.index(opname)
            dev = tuning.DEVICES.index(device)
            if len(ranges) > AUTO_RANGES:
                raise tuning.TuningError(f"{self.source}: {opname} on {device}: "
                                         f"{len(ranges)} size ranges, at most {AUTO_RANGES}")
            for i, (upper, name) in enumerate(ranges):
                if name != "mpi":
                    try:
                        served = backends_module().get(name).devices
                    except ValueError as exc:
                        raise tuning.TuningError(f"{self.source}: {opname} on {device}: "
                                                 f"{exc}") from None
                    if device not in served:
                        raise tuning.TuningError(
                            f"{self.source}: {opname} on {device}: backend {name!r} serves "
                            f"{' and '.join(sorted(served))} buffers only")
                if name not in names:
                    names.append(name)
                self.bound[op][dev][i] = LLONG_MAX if upper is None else upper
                self.pick[op][dev][i] = names.index(name)
            self.nranges[op][dev] = len(ranges)
        self.names = tuple(names)
        return 0

    cdef str digest(self):
        if self.error is not None:
            return "unusable"
        return "defaults" if self.table is None else self.table.digest()


cdef _Chooser load_chooser(object comm):
    """The communicator's chooser, shared by every object of its handle;
    made from its table at first use (a table it cannot use is kept as an
    error, raised once the ranks have agreed)."""
    cdef _Chooser ch = comm.Get_attr(auto_keyval())
    if ch is not None:
        return ch
    ch = _Chooser.__new__(_Chooser)
    ch.source = "defaults"
    tuning = tuning_module()
    try:
        ch.table, ch.source = tuning.resolve(comm.Get_size())
        ch.fill()
    except tuning.TuningError as exc:
        ch.error = exc
    except _builtins.Exception as exc:    # kept too: every rank must reach the agreement
        ch.error = tuning.TuningError(
            f"{ch.source if ch.table is not None else 'MCR_TUNING or the cached table'}: "
            f"cannot use the tuning table: {type(exc).__name__}: {exc}")
    comm.Set_attr(auto_keyval(), ch)
    return ch


cdef int agree(Comm comm, _Chooser ch) except -1:
    """Check, collectively, that every rank decides from the same table (or
    the same defaults); raise TuningError on every rank otherwise. The ranks
    meet first, within the communicator's timeout; the exchange is mcr's, not
    the program's: it runs on mpi4py's view of `comm`, which no interceptor
    (the logger, hooks, checked mode) sees."""
    if not ch.agreed:
        if ch.meeting is None:
            ch.meeting = comm.to_mpi4py().Ibarrier()
        _meet(comm, ch.meeting, "to agree on the tuning table of backend='auto' (at its "
              "first collective there)")
        ch.meeting = None
        tuning_module().agree(comm.to_mpi4py(), ch.digest(), ch.source, ch.error)
        ch.agreed = True
    return 0


cdef inline bint always_mpi(int op) noexcept:
    """Operations auto runs on MPI whatever the table: point-to-point (sender
    and receiver must take the same backend) and Alltoallw (only MPI has it)."""
    return OP_TABLE[op].flags & (OP_P2P | OP_MPI_ONLY) != 0


cdef long long auto_key(int op, _Call m, MPI_Comm comm) noexcept:
    """The size auto decides by, as mcr.bench.ops counts it: the bytes one
    process contributes (one block of a gather or all-to-all, the whole
    vector of a reduction), the same on every rank."""
    cdef side *x = &m.r
    cdef long long n = 0
    cdef int i, size = 1
    if op == CALL_GATHERV or op == CALL_SCATTERV or op == CALL_ALLTOALLV:
        return 0                      # ranks see different sizes: one backend
    if op == CALL_ALLGATHERV or op == CALL_REDUCE_SCATTER or op == CALL_REDUCE_SCATTER_BLOCK:
        MPI_Comm_size(comm, &size)
    if op == CALL_ALLGATHERV or op == CALL_REDUCE_SCATTER:
        for i in range(size):
            n += m.r.counts[i]
        n *= m.r.extent
        return n // size if op == CALL_ALLGATHERV else n
    if (op == CALL_GATHER or op == CALL_REDUCE) and m.s.addr != <char*>MPI_IN_PLACE:
        x = &m.s
    elif op == CALL_SCATTER and m.r.addr == <char*>MPI_IN_PLACE:
        x = &m.s                      # the root's own block stays in place
    n = <long long>x.count * x.extent
    return n * size if op == CALL_REDUCE_SCATTER_BLOCK else n


@cython.final
cdef class _AutoChoice(Interceptor):
    """backend="auto" chooses before the rest of the chain: the hooks, the
    checker, the recorder and the logger see the backend the call runs on
    (and the logger why). In every chain some other interceptor is in."""

    def __cinit__(self, *args):
        self.companion = True

    cdef bint applies_to(self, Comm comm) except -1:
        return True

    cdef object run_call(self, Comm comm, _Call c, Py_ssize_t i):
        cdef str backend
        if OP_TABLE[c.op].flags & OP_COMM:    # (named where it was made: Comm.comm_call)
            return proceed(comm, c, i + 1)
        if c.sub is AUTO_SUB:
            if c.op >= CALL_COUNT:
                c.sub = None                  # neighbourhood collectives: MPI
            else:
                backend = comm.auto_name(c)
                c.sub = None if backend == "mpi" else backends_module().subcomm(comm, backend)
                if not always_mpi(c.op):
                    c.why = comm.chooser.why()
        c.name = "mpi" if c.sub is None else c.sub.name
        return proceed(comm, c, i + 1)


_register(_AutoChoice(20, "auto"))
