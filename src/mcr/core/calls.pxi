# The operations of the one call path (Comm.call) and the call hooks.
#
# CALL_NAMES: an operation's id is its position; its descriptor (OP_TABLE,
# below) says the rest. The persistent form relies on the order of the first
# ids: the sends, then Recv (MPI-1's persistent point-to-point).

cdef enum:
    CALL_SEND
    CALL_BSEND
    CALL_SSEND
    CALL_RSEND
    CALL_RECV
    CALL_SENDRECV
    CALL_SENDRECV_REPLACE
    CALL_BARRIER
    CALL_BCAST
    CALL_GATHER
    CALL_GATHERV
    CALL_SCATTER
    CALL_SCATTERV
    CALL_ALLGATHER
    CALL_ALLGATHERV
    CALL_ALLTOALL
    CALL_ALLTOALLV
    CALL_ALLTOALLW
    CALL_REDUCE
    CALL_ALLREDUCE
    CALL_SCAN
    CALL_EXSCAN
    CALL_REDUCE_SCATTER_BLOCK
    CALL_REDUCE_SCATTER
    CALL_COUNT                # (the number of operations)
    SEEN_COUNT = CALL_COUNT + 5   # and the neighbourhood collectives (neighbor.pxi)
    COMM_OP = SEEN_COUNT      # a collective outside the buffer methods (Comm.made, ...)
    COMM_P2P_OP               # mpi4py's point-to-point on pickled objects
    TABLE_COUNT

cdef enum:                    # the kinds of COMM_OP and COMM_P2P_OP calls
    COMM_MADE                 # blocking: a constructor, a pickled collective
    COMM_STARTED              # Idup: (communicator, request)
    COMM_POSTED               # a non-blocking collective of mpi4py's: a request
    COMM_PERSISTENT           # a persistent one's *_init: an mcr Prequest
    COMM_GROUP                # blocking, by a group's processes only: Create_group
    COMM_P2P                  # send, recv, ...: blocking
    COMM_P2P_POSTED           # isend, issend, irecv

# The descriptor of each operation (OP_TABLE[op], filled in ops.pxi): its
# arguments by name (A_*, in the blocking method's order), what it is
# (OP_* flags), and how to parse it, post it on MPI and post it on a backend's
# Subcomm. Comm.call reads it; nothing else tells the operations apart.

cdef enum:                    # the arguments a call has by name (_Call's fields)
    A_SENDBUF
    A_RECVBUF
    A_DEST
    A_SOURCE
    A_TAG
    A_RECVTAG
    A_STATUS
    A_ROOT
    A_OP
    A_RECVCOUNTS

cdef enum:                    # what an operation is
    OP_P2P = 1                # point-to-point (auto runs it on MPI; not numbered as a collective)
    OP_RECEIVES = 2           # receives a message into recvbuf, with a status argument
    OP_COMPRESSIBLE = 4       # mcr.compress serves it
    OP_NO_PERSISTENT = 8      # no _init form (Sendrecv, Sendrecv_replace)
    OP_MPI_ONLY = 16          # only MPI runs it (Alltoallw: a datatype per process)
    OP_ROOTED = 32            # has a root
    OP_NEIGHBOR = 64          # a neighbourhood collective (run by neighbor.pxi)
    OP_COMM = 128             # outside the buffer methods (constructors, pickled objects)
    OP_FILLS = 256            # writes every byte of its receive message (not in place)

ctypedef int (*parse_fn)(Comm, _Call) except -1
ctypedef int (*mpi_fn)(Comm, _Call, int, MPI_Info, MPI_Request*) except -1
ctypedef object (*sub_fn)(object, _Call)

cdef struct OpDesc:
    int flags
    int variant               # the send mode, the v of Gatherv, ... (shared functions)
    int nargs
    int args[7]
    parse_fn parse            # check and parse the arguments into the call's sides
    mpi_fn post_mpi           # call MPI in a form (the request, when not blocking)
    sub_fn post_sub           # call a backend's Subcomm method: its Request

cdef OpDesc OP_TABLE[TABLE_COUNT]

cdef tuple CALL_NAMES = (
    "Send", "Bsend", "Ssend", "Rsend", "Recv", "Sendrecv", "Sendrecv_replace",
    "Barrier", "Bcast", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather",
    "Allgatherv", "Alltoall", "Alltoallv", "Alltoallw", "Reduce", "Allreduce", "Scan",
    "Exscan", "Reduce_scatter_block", "Reduce_scatter")

# The operations the call hooks and the logger see: those of Comm.call, then
# the neighborhood collectives of topologies (neighbor.pxi), as CALL_COUNT +
# their kind; their arguments are (sendbuf, recvbuf).
cdef tuple SEEN_NAMES = CALL_NAMES + (
    "Neighbor_allgather", "Neighbor_allgatherv", "Neighbor_alltoall", "Neighbor_alltoallv",
    "Neighbor_alltoallw")
cdef tuple FORM_NAMES = ("blocking", "nonblocking", "persistent")


cdef int call_id(object name) except -1:
    """The id of the operation a method name names, in any form
    ("Allreduce", "Iallreduce", "Allreduce_init")."""
    if not isinstance(name, str):
        raise TypeError(f"op: expected an operation name such as 'Allreduce', got "
                        f"{type(name).__name__}")
    cdef str base = name[:-5] if name.endswith("_init") else name
    if base in CALL_NAMES:
        return CALL_NAMES.index(base)
    if base.startswith("I") and len(base) > 1 and base[1].upper() + base[2:] in CALL_NAMES:
        return CALL_NAMES.index(base[1].upper() + base[2:])
    raise ValueError(f"op: unknown operation {name!r} (a buffer method of mcr.Comm, "
                     "e.g. 'Allreduce', 'Ialltoallv', 'Bcast_init')")


def _set_unlogged(comm):
    """Mark `comm` as one of mcr's private communicators (those of
    mcr.compress, mcr.Fusion): the logger, the watch and the program's interceptors
    do not see its calls (the call hooks do: every buffer call)."""
    (<Comm?>comm).unlogged = True
    (<Comm>comm).epoch = 0        # its chain: without the logger and the watch


def _private_dup(comm):
    """A private copy of `comm` (unlogged), made by a Dup on its chain (the progress
    engine's window; checked mode and the timeout see the collective) that the
    program's interceptors do not see: mcr makes it, not the program."""
    cdef Comm c = <Comm?>comm
    copy = c.inherit(c.made("Dup", _MPI.Intracomm.Dup, (), -1, True))
    _set_unlogged(copy)
    return copy


cdef str method_name(int op, int form):
    """The Comm method of `op` in `form`: Alltoallw, Ialltoallw, Alltoallw_init."""
    cdef str name = CALL_NAMES[op]
    if form == NONBLOCKING:
        return "I" + name[0].lower() + name[1:]
    return name + "_init" if form == PERSISTENT else name


@cython.final
cdef class Call:
    """One call of a buffer method, as the call hooks (``mcr.hooks``) and
    interceptors (``mcr.interceptors``) see it; interceptors also see the
    calls that make communicators (``"Dup"``, ``"Split"``, ...) and mpi4py's
    methods on pickled objects (``"bcast"``, ``"send"``, ...), with mpi4py's
    arguments.

    Attributes
    ----------
    comm : mcr.Comm
        The communicator called.
    op : str
        The operation (``"Allreduce"``, ``"Send"``, ``"Neighbor_alltoall"``,
        ...), whatever its form.
    form : str
        ``"blocking"``, ``"nonblocking"`` (``I...``) or ``"persistent"``
        (``..._init``).
    backend : str
        The backend chosen for it (``"mpi"``, ``"gloo"``, ...).
    args : tuple
        The method's arguments, in the order of the blocking method's signature
        (``None`` for the status of a non-blocking receive); for a
        neighborhood collective, ``(sendbuf, recvbuf)``.
    """
    cdef readonly object comm
    cdef readonly str op
    cdef readonly str form
    cdef readonly str backend
    cdef readonly tuple args
    cdef _Call call          # what it shows (an interceptor's next runs it)

    def __init__(self, *args, **kwargs):
        raise TypeError("mcr.Call: made by mcr for each call, not by hand (an interceptor "
                        "passes on the one it was given to next)")

    def __repr__(self):
        return f"<mcr.Call {self.op} {self.form} on {self.backend}>"


cdef Call call_view(object comm, _Call c):
    """The Call that shows `c` (its backend chosen) to Python code."""
    cdef Call v = Call.__new__(Call)
    v.comm, v.form, v.backend, v.call = comm, FORM_NAMES[c.form], c.name, c
    if OP_TABLE[c.op].flags & OP_COMM:
        v.op, v.args = c.callname, c.makeargs
    else:
        v.op, v.args = SEEN_NAMES[c.op], c.args()
    return v


cdef list call_hooks = []


@cython.final
cdef class _Hooks(Interceptor):
    """The call hooks (mcr.hooks) see each call, its backend chosen, before
    it runs, and the callables they return get its result."""

    cdef bint applies_to(self, Comm comm) except -1:
        return bool(call_hooks)     # (on private communicators too: every buffer call)

    cdef object run_call(self, Comm comm, _Call c, Py_ssize_t i):
        if OP_TABLE[c.op].flags & OP_COMM:      # (the hooks see the buffer methods')
            return proceed(comm, c, i + 1)
        cdef Call view = call_view(comm, c)
        cdef list after = []
        for hook in tuple(call_hooks):
            then = hook(view)
            if then is not None:
                if not callable(then):
                    raise TypeError(f"hook {getattr(hook, '__qualname__', hook)!r}: returned "
                                    f"{type(then).__name__}; expected a callable (to get the "
                                    f"call's result) or None")
                after.append(then)
        result = proceed(comm, c, i + 1)
        try:
            for then in after:
                then(result)
        except BaseException as exc:
            if result is not None:          # (posted: not lost with the error)
                exc.request = result
                add_note(exc, f"{SEEN_NAMES[c.op]} ({FORM_NAMES[c.form]}) was made: its "
                              f"request is the exception's `request`, to wait for or free")
            raise
        return result


_register(_Hooks(30, "hooks"))


def _add_call_hook(hook):
    """Add `hook` (see mcr.hooks.add)."""
    if not callable(hook):
        raise TypeError(f"hook: expected a callable, got {type(hook).__name__}")
    call_hooks.append(hook)
    settings_changed()


def _remove_call_hook(hook):
    """Remove `hook` (see mcr.hooks.remove)."""
    try:
        call_hooks.remove(hook)
    except ValueError:
        raise ValueError(f"hook: {hook!r} is not installed") from None
    settings_changed()
