# Hangs turned into errors: checked mode, timeouts and the flight recorder
# (mcr/errors.py; docs/debugging.rst).
#
# A communicator gets a _Watch when it is checked ($MCR_CHECK, comm.checked),
# has a timeout ($MCR_TIMEOUT, comm.timeout), or the flight recorder is on
# ($MCR_FLIGHT_RECORDER); its calls then run through the watch's interceptor
# (_Watched, below, on the communicator's chain: chain.pxi), which applies
# what follows.
# - Checked: before a collective, the processes exchange a fingerprint of the
#   call (one Allgather of FP_BYTES each, on a private duplicate of the
#   communicator) and raise together when they differ, or when the arguments
#   of one of them were refused: none of them has communicated yet.
# - Timeout: a blocking call runs as its non-blocking form and a timed wait.
#   The Request carries the timeout, and its waits poll (driving MPI) until
#   then, and raise TimeoutError naming this process's pending calls.
# - Records: with a timeout or the recorder on, each call gets a _Pend record,
#   kept while it is pending (the TimeoutError lists them) and, for the
#   recorder, in a ring of the latest calls, written to a file at a timeout, a
#   mismatch and exit (read by `python -m mcr.debug`).

import atexit as _atexit
import builtins as _builtins
import json as _json
import os as _os
import socket as _socket
import time as _time
from collections import deque as _deque
from zlib import crc32 as _crc32


from mcr import errors as _errors
from mcr._env import count as _env_count, flag as _env_flag, seconds as _env_seconds

cdef enum:
    FP_INTS = 19
    FP_TEXT = 360                  # the refusal of a process's arguments, if any
    FP_BYTES = FP_INTS * 8 + FP_TEXT
    FP_MAGIC = 0x6d637231          # "mcr1": a fingerprint, not something else

cdef enum:                         # the fields of a fingerprint
    F_MAGIC, F_SEQ, F_OP, F_FORM, F_BACKEND, F_ROOT, F_DTYPE, F_ROP, F_COUNT,
    F_SEND, F_RECV, F_HASH, F_ERROR,
    F_TSIZE,                       # bytes of data per element of F_COUNT (MPI_Type_size)
    F_SIZE,
    F_RESHAPE,                     # what the interceptors after the watch make of the message
    F_PAIRS,                       # what moves between each pair of processes, weighted
    F_SUNIT, F_RUNIT               # bytes of data per element of F_SEND, of F_RECV

# compared across processes: a difference is a mismatch (F_DTYPE, F_COUNT and
# F_HASH only once the operations agree)
cdef tuple MATCHED = (F_SEQ, F_OP, F_FORM, F_BACKEND, F_ROOT, F_ROP, F_DTYPE, F_COUNT,
                      F_HASH, F_RESHAPE)

# the collective calls outside the buffer methods, fingerprinted as op CALL_COUNT + their
# index: those that make or free a communicator (MADE_CALL_NAMES), mpi4py's neighborhood
# collectives, and mpi4py's methods on pickled objects
cdef tuple MADE_CALL_NAMES = ("Dup", "Clone", "Split", "Split_type", "Create", "Free",
                              "Dup_with_info", "Idup", "Idup_with_info",
                              "Create_cart", "Create_graph", "Create_dist_graph",
                              "Create_dist_graph_adjacent", "Sub", "Create_group")
cdef tuple COMM_CALL_NAMES = MADE_CALL_NAMES + (
    "Neighbor_allgather", "Neighbor_allgatherv", "Neighbor_alltoall", "Neighbor_alltoallv",
    "Neighbor_alltoallw", "Ineighbor_allgather", "Ineighbor_allgatherv", "Ineighbor_alltoall",
    "Ineighbor_alltoallv", "Ineighbor_alltoallw", "Neighbor_allgather_init",
    "Neighbor_allgatherv_init", "Neighbor_alltoall_init", "Neighbor_alltoallv_init",
    "Neighbor_alltoallw_init", "neighbor_allgather", "neighbor_alltoall", "barrier", "bcast",
    "gather", "scatter", "allgather", "alltoall", "reduce", "allreduce", "scan", "exscan")

# the neighborhood collectives whose block sizes checked mode compares (nb_sizes_agree):
# those of buffers but alltoallw (derived datatypes: MPI's own checks), in every form and on
# every backend
cdef frozenset NB_SIZED_NAMES = frozenset(
    prefix + "eighbor_" + name + suffix for prefix, suffix in (("N", ""), ("In", ""),
                                                               ("N", "_init"))
    for name in ("allgather", "allgatherv", "alltoall", "alltoallv"))

# mpi4py's point-to-point methods on pickled objects (obj_p2p), recorded as op
# CALL_COUNT + len(COMM_CALL_NAMES) + their index
cdef enum:
    P2P_SEND, P2P_SSEND, P2P_RECV, P2P_SENDRECV, P2P_PROBE, P2P_MPROBE, P2P_ISEND,
    P2P_ISSEND, P2P_IRECV

cdef tuple OBJ_P2P_NAMES = ("send", "ssend", "recv", "sendrecv", "probe", "mprobe", "isend",
                            "issend", "irecv")

cdef dict BACKEND_OF_CRC = {}      # crc32 of a backend name -> the name


cdef long long backend_id(str name):
    cdef long long key = _crc32(name.encode())
    BACKEND_OF_CRC[key] = name
    return key


cdef dict RESHAPE_OF_CRC = {0: ""}   # crc32 of what interceptors make of a message -> it


cdef long long reshape_id(Comm comm, _Call c, Py_ssize_t i):
    """What the interceptors after the i-th of `c`'s chain make of its
    message (Interceptor.reshapes: compression's codec), as a number; 0:
    nothing."""
    cdef tuple chain = c.chain
    cdef Py_ssize_t k
    parts = []
    for k in range(i + 1, len(chain)):
        part = (<Interceptor>chain[k]).reshapes(comm, c)
        if part:
            parts.append(part)
    if not parts:
        return 0
    text = " ".join(parts)
    cdef long long key = _crc32(text.encode())
    RESHAPE_OF_CRC[key] = text
    return key


cdef bint ENV_CHECK = _env_flag("MCR_CHECK")
cdef double ENV_TIMEOUT = _env_seconds("MCR_TIMEOUT")
cdef object FLIGHT_DIR = _os.environ.get("MCR_FLIGHT_RECORDER") or None
cdef Py_ssize_t FLIGHT_KEEP = _env_count("MCR_FLIGHT_KEEP", 1000)
cdef bint recorder_on = FLIGHT_DIR is not None


cdef double as_timeout(object value) except -1:
    """A communicator's timeout: None or 0 for none, else seconds > 0."""
    if value is None:
        return 0.0
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"timeout: expected seconds (a number) or None, got "
                        f"{type(value).__name__}") from None
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"timeout: expected seconds >= 0 (0 or None: none), got {value!r}")
    return seconds


@cython.final
cdef class _Watch:
    """What a communicator watches: checked mode, its timeout, the sequence
    number of its collectives, and its private duplicate (for fingerprints)."""
    cdef bint checked
    cdef double timeout
    cdef long long seq             # collectives called while watched
    cdef MPI_Comm priv
    cdef MPI_Request priv_req      # the MPI_Comm_idup making priv, while pending
    cdef str label                 # its name in records (the same on every member)
    cdef list members              # its processes, as ranks of COMM_WORLD

    def __cinit__(self):
        self.priv = MPI_COMM_NULL
        self.priv_req = MPI_REQUEST_NULL

    cdef int free_priv(self) except -1:
        cdef int finalized = 1
        if self.priv_req != MPI_REQUEST_NULL:   # its MPI_Comm_idup timed out, still pending
            return 0
        MPI_Finalized(&finalized)
        if self.priv != MPI_COMM_NULL and not finalized:
            CHKERR(MPI_Comm_free(&self.priv))
        self.priv = MPI_COMM_NULL
        return 0


cdef dict label_counts = {}        # members -> communicators labelled with them here


cdef str comm_label(_Watch w, MPI_Comm comm):
    """The communicator's name in records: "world", "self", or its processes
    (as COMM_WORLD ranks) and how many with the same processes were labelled
    before it here ("0-3#2"): the same on every member when they create their
    communicators in the same order."""
    if w.label is not None:
        return w.label
    cdef int result = MPI_UNEQUAL, size = 0
    cdef MPI_Group group, world
    MPI_Comm_compare(comm, MPI_COMM_WORLD, &result)
    CHKERR(MPI_Comm_size(comm, &size))
    ranks = list(range(size))
    cdef int *mine = <int*>PyMem_Malloc(2 * size * sizeof(int) + 1)
    if mine == NULL:
        raise MemoryError()
    try:
        for i in range(size):
            mine[i] = i
        CHKERR(MPI_Comm_group(comm, &group))
        CHKERR(MPI_Comm_group(MPI_COMM_WORLD, &world))
        CHKERR(MPI_Group_translate_ranks(group, size, mine, world, mine + size))
        ranks = [mine[size + i] for i in range(size)]
        MPI_Group_free(&group)
        MPI_Group_free(&world)
    finally:
        PyMem_Free(mine)
    w.members = ranks
    if result == MPI_IDENT:
        w.label = "world"
    elif comm == MPI_COMM_SELF:
        w.label = "self"
    else:
        key = tuple(ranks)
        label_counts[key] = label_counts.get(key, 0) + 1
        w.label = f"{ranks_text(ranks)}#{label_counts[key]}"
    return w.label


cdef str ranks_text(list ranks):
    """0-3, or 0,2,5: a list of ranks, runs shortened."""
    if not ranks:
        return "none"
    parts = []
    start = prev = ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(parts)


# -- Fingerprints -----------------------------------------------------------------

cdef long long counts_hash(side *x, int size) noexcept:
    cdef unsigned long long h = 1469598103934665603ULL
    cdef int i
    if x.counts == NULL:
        return -1
    for i in range(size):
        h = (h ^ <unsigned int>x.counts[i]) * 1099511628211ULL
    return <long long>(h >> 1)


cdef inline int own(side *x, int rank) noexcept:
    """This process's block of a vector side."""
    return x.counts[rank] if x.counts != NULL and 0 <= rank < x.nblocks else x.count


cdef inline unsigned long long pair_weight(int sender, int receiver) noexcept:
    """A pseudo-random weight of the pair (the same on every process)."""
    cdef unsigned long long z = (<unsigned long long>sender << 32 | <unsigned int>receiver)
    z = (z + 0x9E3779B97F4A7C15ULL) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 31)) * 0x94D049BB133111EBULL
    return z ^ (z >> 29)


cdef long long pairs(side *s, side *r, int op, int size, int rank, int root,
                     long long mine, long long sunit, long long runit) noexcept:
    """The bytes this process sends to each process (`sunit` per element of
    `s`), weighted by the pair, less those it receives from each (`runit`
    per element of `r`) (F_PAIRS): summed over the processes, zero (but for a
    2**-64 chance) only when every pair agrees on what moves, whatever
    datatypes each uses. `mine`: the elements a gather sends the root, or a
    scatter receives from it."""
    cdef unsigned long long h = 0
    cdef int j
    if op == CALL_ALLTOALLV:
        for j in range(size):
            h += <unsigned long long>(own(s, j) * sunit) * pair_weight(rank, j)
            h -= <unsigned long long>(own(r, j) * runit) * pair_weight(j, rank)
    elif op == CALL_GATHER or op == CALL_GATHERV:
        h += <unsigned long long>(mine * sunit) * pair_weight(rank, root)
        if rank == root:
            for j in range(size):
                h -= <unsigned long long>(own(r, j) * runit) * pair_weight(j, root)
    else:                                  # Scatter(v)
        h -= <unsigned long long>(mine * runit) * pair_weight(root, rank)
        if rank == root:
            for j in range(size):
                h += <unsigned long long>(own(s, j) * sunit) * pair_weight(root, j)
    return <long long>h


cdef int msg_fields(long long *f, int op, _Call m, int size, int rank) except -1:
    """The dtype, counts and totals of a parsed collective, into fingerprint `f`:
    what each process must agree on (F_COUNT, F_HASH), and for the gathers,
    scatters and all-to-alls, the elements it sends and receives, whose sums
    over the processes must be equal (in bytes: F_SUNIT, F_RUNIT). An
    in-place side has the other's datatype (set_in_place), so its units."""
    cdef side *s = &m.s
    cdef side *r = &m.r
    cdef bint in_place_s = s.addr == <char*>MPI_IN_PLACE
    cdef bint in_place_r = r.addr == <char*>MPI_IN_PLACE
    cdef bint root = f[F_ROOT] == rank
    f[F_SUNIT], f[F_RUNIT] = type_size(s), type_size(r)
    f[F_DTYPE] = r.tindex
    f[F_TSIZE] = f[F_RUNIT]
    if op == CALL_BCAST:
        f[F_COUNT] = r.count
    elif op == CALL_GATHER or op == CALL_GATHERV:
        if not root:
            f[F_DTYPE], f[F_TSIZE] = s.tindex, f[F_SUNIT]
        if op == CALL_GATHER:
            f[F_COUNT] = r.count if root else s.count
        f[F_SEND] = (own(r, rank) if in_place_s else s.count) if root else s.count
        if root:
            f[F_RECV] = total(r, size)
        if op == CALL_GATHERV:
            f[F_PAIRS] = pairs(s, r, op, size, rank, f[F_ROOT], f[F_SEND], f[F_SUNIT],
                               f[F_RUNIT])
    elif op == CALL_SCATTER or op == CALL_SCATTERV:
        if root:
            f[F_DTYPE], f[F_TSIZE] = s.tindex, f[F_SUNIT]
            f[F_SEND] = total(s, size)
        if op == CALL_SCATTER:
            f[F_COUNT] = s.count if root else r.count
        f[F_RECV] = own(s, rank) if root and in_place_r else r.count
        if op == CALL_SCATTERV:
            f[F_PAIRS] = pairs(s, r, op, size, rank, f[F_ROOT], f[F_RECV], f[F_SUNIT],
                               f[F_RUNIT])
    elif op == CALL_ALLGATHER or op == CALL_ALLTOALL or op == CALL_ALLREDUCE \
            or op == CALL_SCAN or op == CALL_EXSCAN or op == CALL_REDUCE_SCATTER_BLOCK:
        f[F_COUNT] = r.count
    elif op == CALL_ALLGATHERV:
        f[F_COUNT] = total(r, size)
        f[F_HASH] = counts_hash(r, size)
        f[F_SEND] = (own(r, rank) if in_place_s else s.count) * size
        f[F_RECV] = total(r, size)
    elif op == CALL_ALLTOALLV:
        f[F_SEND] = total(r if in_place_s else s, size)
        f[F_RECV] = total(r, size)
        f[F_PAIRS] = pairs(r if in_place_s else s, r, op, size, rank, -1, 0, f[F_SUNIT],
                           f[F_RUNIT])
    elif op == CALL_REDUCE:
        if not in_place_s:
            f[F_DTYPE], f[F_TSIZE] = s.tindex, f[F_SUNIT]
        f[F_COUNT] = r.count if in_place_s else s.count
    elif op == CALL_REDUCE_SCATTER:
        f[F_COUNT] = total(r, size)
        f[F_HASH] = counts_hash(r, size)
    return 0


cdef int rop_id(object op) noexcept:
    """The reduction op as the same number on every process (handles may differ)."""
    cdef MPI_Op h
    if not isinstance(op, _MPI.Op):
        return -1
    h = (<_MPI.Op>op).ob_mpi
    for j in range(NOPS):
        if OPS[j] == h:
            return j
    if h == MPI_MAXLOC:
        return NOPS
    if h == MPI_MINLOC:
        return NOPS + 1
    return 99


cdef inline int int_or(object value, int other) noexcept:
    return value if type(value) is int and -2**31 <= value < 2**31 else other


cdef int fill_fingerprint(long long *f, Comm comm, _Call c, int form, str backend,
                          long long seq) except -1:
    """Fingerprint `f` of call `c` in `form` (its sides unless it was refused)."""
    cdef int op = c.op
    cdef int size = comm.nprocs()
    cdef int i
    cdef side *x
    for i in range(FP_INTS):
        f[i] = 0
    f[F_MAGIC], f[F_SEQ], f[F_OP], f[F_FORM] = FP_MAGIC, seq, op, form
    f[F_BACKEND], f[F_SIZE] = backend_id(backend), size
    f[F_ROOT] = f[F_DTYPE] = f[F_ROP] = f[F_COUNT] = f[F_HASH] = -1
    if OP_TABLE[op].flags & OP_ROOTED:
        f[F_ROOT] = int_or(c.root, -1)
    if OP_TABLE[op].args[2] == A_OP or OP_TABLE[op].args[3] == A_OP:
        f[F_ROP] = rop_id(SUM if c.redop is None else c.redop)
    if not c.parsed:
        return 0
    if op == CALL_ALLTOALLW:
        f[F_DTYPE] = -2                      # derived datatypes
    elif OP_TABLE[op].flags & OP_P2P:             # what this process moves, and the peer
        x = &c.r if op == CALL_RECV or op == CALL_SENDRECV_REPLACE else &c.s
        f[F_DTYPE], f[F_COUNT], f[F_TSIZE] = x.tindex, x.count, type_size(x)
        f[F_ROOT] = int_or(c.source if op == CALL_RECV else c.dest, -1)
    else:
        msg_fields(f, op, c, size, comm.myrank())
    return 0


cdef str rop_name(long long k):
    if 0 <= k < NOPS:
        return OP_NAMES[k]
    return {NOPS: "MAXLOC", NOPS + 1: "MINLOC"}.get(k, "user op")


cdef str fingerprint_text(long long *f, bint with_seq=True, bint with_backend=True,
                          bint with_form=False):
    """"Allreduce float32[4] SUM #17": a fingerprint as people read it
    (`with_form`: named by its method, "Iallreduce", "Allreduce_init")."""
    cdef int op = <int>f[F_OP]
    if CALL_COUNT <= op < CALL_COUNT + len(COMM_CALL_NAMES):
        name = COMM_CALL_NAMES[op - CALL_COUNT]
        if f[F_ROP] >= 0:
            name = f"{name} {rop_name(f[F_ROP])}"
        if f[F_ROOT] >= 0:
            name = f"{name} root={f[F_ROOT]}"
        return f"{name} #{f[F_SEQ]}" if with_seq else name
    if not 0 <= op < CALL_COUNT:
        return "(not an mcr call)"
    parts = [method_name(op, <int>f[F_FORM]) if with_form else CALL_NAMES[op]]
    # a datatype mcr does not name (derived, BYTE) by the bytes of data in one
    # element, which is what MPI matches it by ("24-byte[1]"; mcr.debug reads it)
    dtype = TYPE_NAMES[f[F_DTYPE]] if 0 <= f[F_DTYPE] < len(TYPE_NAMES) else \
        "derived" if f[F_DTYPE] == -2 else f"{f[F_TSIZE]}-byte" if f[F_TSIZE] > 0 else ""
    if op == CALL_BARRIER:
        pass
    elif f[F_COUNT] >= 0:
        parts.append(f"{dtype}[{f[F_COUNT]}]")
    else:
        moves = f"{dtype} send {f[F_SEND]}" if f[F_SEND] else dtype
        moves = f"{moves} recv {f[F_RECV]}".strip() if f[F_RECV] else moves
        if moves:                           # (nothing known of a refused call)
            parts.append(moves)
    if f[F_ROP] >= 0:
        parts.append(rop_name(f[F_ROP]))
    if f[F_ROOT] >= 0 and op > CALL_SENDRECV_REPLACE:
        parts.append(f"root={f[F_ROOT]}")
    backend = BACKEND_OF_CRC.get(f[F_BACKEND], "another backend")
    if with_backend and backend != "mpi":
        parts.append(f"on {backend}")
    reshape = RESHAPE_OF_CRC.get(f[F_RESHAPE], "reshaped otherwise")
    if reshape:
        parts.append(reshape)
    if with_seq:
        parts.append(f"#{f[F_SEQ]}")
    return " ".join(parts)


cdef str grouped(list lines):
    """"rank 0: X; ranks 1-3: Y": per-process lines, equal ones grouped."""
    order = []
    who = {}
    for rank, line in enumerate(lines):
        if line not in who:
            who[line] = []
            order.append(line)
        who[line].append(rank)
    return "; ".join(f"rank{'s' if len(who[l]) > 1 else ''} {ranks_text(who[l])}: {l}"
                     for l in order)


cdef bint same_signatures(long long *f, long long *g, int k) noexcept:
    """Whether fields F_DTYPE or F_COUNT (`k`), which differ between
    fingerprints `f` and `g` of one operation, still describe the same type
    signature. MPI matches the data moved, not the datatypes: a process may
    send or receive in a derived datatype (or BYTE: no element type known,
    F_DTYPE -1) what another moves in named ones, a column type as 3 DOUBLEs,
    when the bytes agree (count x type size). Not in a reduction, whose
    datatype is the same at every process."""
    if f[F_ROP] >= 0 or (f[F_DTYPE] >= 0 and g[F_DTYPE] >= 0):
        return False
    if k == F_DTYPE:
        return True
    return k == F_COUNT and f[F_COUNT] >= 0 and g[F_COUNT] >= 0 \
        and f[F_COUNT] * f[F_TSIZE] == g[F_COUNT] * g[F_TSIZE]


cdef object mismatch(bytearray everyone, int size):
    """Why the fingerprints of `everyone` disagree, or None when they agree."""
    cdef char *base = everyone
    cdef long long *f = <long long*>base
    cdef long long *g
    cdef int i, k
    for i in range(1, size):
        g = <long long*>(base + i * FP_BYTES)
        for k in MATCHED:
            if k in (F_DTYPE, F_COUNT, F_HASH) and g[F_OP] != f[F_OP]:
                continue
            if g[k] != f[k] and not same_signatures(f, g, k):
                return {F_SEQ: "their calls are out of step", F_OP: "different operations",
                        F_FORM: "blocking and non-blocking or persistent forms, which MPI "
                                "does not match",
                        F_BACKEND: "different backends", F_ROOT: "different roots",
                        F_ROP: "different reduction ops", F_DTYPE: "different element types",
                        F_COUNT: "different counts",
                        F_HASH: "different counts arrays",
                        F_RESHAPE: "different compression"}[k]
    cdef long long sent = 0, received = 0, unit = 0
    cdef unsigned long long pairsum = 0
    if CALL_GATHER <= f[F_OP] <= CALL_ALLTOALLV:
        for i in range(size):               # in bytes: the processes' datatypes may differ
            g = <long long*>(base + i * FP_BYTES)
            sent += g[F_SEND] * g[F_SUNIT]
            received += g[F_RECV] * g[F_RUNIT]
            for k in ((F_SUNIT,) if g[F_SEND] else ()) + ((F_RUNIT,) if g[F_RECV] else ()):
                unit = g[k] if unit in (0, g[k]) else -1
        if sent != received:
            if unit <= 0:
                return (f"counts that do not add up: the processes send {sent} bytes of data "
                        f"in all and receive {received}")
            return (f"counts that do not add up: the processes send {sent // unit} elements "
                    f"in all and receive {received // unit}")
        for i in range(size):
            g = <long long*>(base + i * FP_BYTES)
            pairsum += <unsigned long long>g[F_PAIRS]
        if pairsum:
            return ("counts that do not match: some process sends another a block of a "
                    "size that this one does not expect from it")
    return None


cdef _Pend check_collective(Comm comm, _Watch w, _Call c, Py_ssize_t i, int form,
                            str backend, bint record):
    """Checked mode: parse the call, agree with the other processes on its
    fingerprint (as run in `form`), and raise on every process if they differ
    or one refused its arguments. The call's record when `record`: made
    before the agreement, so that a call refused, mismatched or timed out
    there is recorded, as failed."""
    comm.prologue(None)                 # a null communicator: the same on every process
    err = None
    try:
        comm.parse(c)
    except _builtins.Exception as exc:  # (Python's: KeyboardInterrupt and the like propagate)
        err = exc
    cdef bytearray mine = bytearray(FP_BYTES)
    cdef char *mbuf = mine
    cdef long long *f = <long long*>mbuf
    fill_fingerprint(f, comm, c, form, backend, w.seq)
    if err is None:
        try:
            f[F_RESHAPE] = reshape_id(comm, c, i)
        except _builtins.Exception as exc:
            err = exc
    if err is None and f[F_RESHAPE]:               # (the others print it)
        text = RESHAPE_OF_CRC[f[F_RESHAPE]].encode("utf-8", "replace")[:FP_TEXT - 1]
        mine[FP_INTS * 8:FP_INTS * 8 + len(text)] = text
    if err is not None:
        put_refusal(mine, err)
    cdef _Pend p = new_pend(comm, w, c, c.form, backend, w.seq) if record else None
    try:
        agree_fingerprints(comm, w, mine, err)
    except BaseException:
        if p is not None and err is not None:
            pend_refused(p, err)
        elif p is not None:
            pend_end(p, PEND_FAILED)
        raise
    return p


cdef int check_comm_call(Comm comm, _Watch w, str call, int root, _Call c,
                         object refused) except -1:
    """Checked mode: agree with the other processes on a collective call
    outside the buffer methods (`call`, one of COMM_CALL_NAMES; `root`, or
    -1) as on a collective, before any enters MPI's call, which blocks
    uninterruptibly (or, for Free, leaves the others waiting): when one calls
    another of these or a collective instead, every process raises
    MismatchError. The call has its number in the sequence of collectives
    already (meet). `c`: the call, for mpi4py's methods on pickled objects
    (pickled_refusal), or None; `refused`: this process's refusal of the
    call's arguments, found before (nb_refused), or None."""
    cdef bytearray mine = bytearray(FP_BYTES)
    cdef char *mbuf = mine
    cdef long long *f = <long long*>mbuf
    f[F_MAGIC], f[F_SEQ], f[F_OP], f[F_FORM] = (FP_MAGIC, w.seq,
                                                CALL_COUNT + COMM_CALL_NAMES.index(call), BLOCKING)
    f[F_BACKEND], f[F_SIZE] = backend_id("mpi"), comm.nprocs()
    f[F_DTYPE] = f[F_ROP] = f[F_COUNT] = f[F_HASH] = -1
    f[F_ROOT] = root
    err = refused
    if err is None and c is not None and call in PICKLED_NAMES:
        err = pickled_refusal(comm, c, f)
    if err is not None:
        put_refusal(mine, err)
    agree_fingerprints(comm, w, mine, err)
    return 0


cdef frozenset PICKLED_NAMES = frozenset(("bcast", "gather", "scatter", "allgather", "alltoall",
                                          "reduce", "allreduce", "scan", "exscan"))


cdef object pickled_refusal(Comm comm, _Call c, long long *f):
    """Checked mode, one of mpi4py's collectives on pickled objects: the
    reduction op into fingerprint `f`, and what mpi4py would refuse on this
    process alone (a list of the wrong length to scatter, an object that does
    not pickle), returned before the processes agree, so that the refusal
    reaches them all (as a buffer method's). An iterable to scatter becomes
    the list mpi4py would make of it. Costs a second pickling of what this
    process sends."""
    cdef str name = c.callname
    cdef tuple args = c.makeargs
    cdef int size = comm.nprocs()
    if name in ("reduce", "allreduce", "scan", "exscan"):
        f[F_ROP] = rop_id(args[1])          # (-1: a Python function, not compared)
    sent = args[0]
    if name == "bcast" and comm.myrank() != c.iroot:
        return None
    try:
        if name == "alltoall" or name == "scatter" and comm.myrank() == c.iroot:
            if sent is None:
                return None                 # (mpi4py sends None to each)
            sent = list(sent)
            if len(sent) != size:
                raise ValueError(f"sendobj: expecting {size} items, got {len(sent)}")
            c.makeargs = (sent,) + args[1:]
        elif name == "scatter":
            return None
        _mpi4py.pickle.dumps(sent)
    except _builtins.Exception as exc:      # (Python's)
        return exc
    return None


cdef void put_refusal(bytearray mine, object err):
    """This process's refusal of its arguments into its fingerprint `mine`."""
    cdef char *mbuf = mine
    text = f"{type(err).__name__}: {err}".encode("utf-8", "replace")[:FP_TEXT - 1]
    mine[FP_INTS * 8:FP_INTS * 8 + len(text)] = text
    (<long long*>mbuf)[F_ERROR] = len(text)


cdef int agree_fingerprints(Comm comm, _Watch w, bytearray mine, object err) except -1:
    """Exchange this process's fingerprint `mine` with the others', and raise
    on every process when they differ or when one refused its arguments
    (`err`: this process's refusal, raised as itself)."""
    cdef int size = comm.nprocs()
    cdef bytearray everyone = bytearray(FP_BYTES * size)
    cdef char *mbuf = mine
    cdef long long *f = <long long*>mbuf
    exchange(comm, w, mine, everyone, size, fingerprint_text(f))
    cdef char *base = everyone
    cdef long long *fp
    cdef int i
    cdef bint forms = False            # the forms differ: name the calls by method
    for i in range(size):
        forms = forms or (<long long*>(base + i * FP_BYTES))[F_FORM] != f[F_FORM]
    lines = []
    refused = []
    for i in range(size):
        fp = <long long*>(base + i * FP_BYTES)
        if fp[F_MAGIC] != FP_MAGIC:
            lines.append("(not a fingerprint: a call outside mcr on the private communicator)")
            continue
        if fp[F_RESHAPE] and not fp[F_ERROR]:       # its text travels in the text area
            start = i * FP_BYTES + FP_INTS * 8
            text = bytes(everyone[start:start + FP_TEXT]).split(b"\0", 1)[0]
            RESHAPE_OF_CRC[fp[F_RESHAPE]] = text.decode("utf-8", "replace")
        lines.append(fingerprint_text(fp, True, True, forms))
        if fp[F_ERROR]:
            start = i * FP_BYTES + FP_INTS * 8
            refused.append((i, bytes(everyone[start:start + fp[F_ERROR]]).decode("utf-8",
                                                                                  "replace")))
    label = comm_label(w, comm.ob_mpi)
    if refused:
        if err is not None:
            raise err
        who = "; ".join(f"rank {i}: {text}" for i, text in refused)
        raise _errors.MismatchError(f"{fingerprint_text(f)} on {label}: the arguments of "
                            f"{'rank' if len(refused) == 1 else 'ranks'} "
                            f"{ranks_text([i for i, _ in refused])} were refused, so no "
                            f"process communicated ({who})", lines)
    why = mismatch(everyone, size)
    if why is not None:
        message = f"collective mismatch on {label} ({why}): {grouped(lines)}"
        flight_dump("mismatch", message)
        raise _errors.MismatchError(message, lines)
    return 0


cdef int exchange(Comm comm, _Watch w, bytearray mine, bytearray everyone, int size,
                  str what) except -1:
    """Allgather the fingerprints on the private communicator (made at the
    first one), polled: TimeoutError at the communicator's timeout, if any.
    Always the non-blocking forms (MPI_Comm_idup, MPI_Iallgather): MPI does
    not match them with blocking ones, and a process with a timeout must
    meet those without."""
    cdef MPI_Request req = MPI_REQUEST_NULL
    cdef char *sbuf = mine
    cdef char *rbuf = everyone
    if w.priv_req != MPI_REQUEST_NULL or w.priv == MPI_COMM_NULL:
        # (one still pending timed out before: wait for it, not for a second one)
        if w.priv_req == MPI_REQUEST_NULL:
            CHKERR(MPI_Comm_idup(comm.ob_mpi, &w.priv, &w.priv_req))
        try:
            poll_request(&w.priv_req, w, comm, f"{what}: making the checked "
                                               "communicator's private copy (MPI_Comm_idup)")
        except BaseException:
            w.seq -= 1          # nothing was exchanged: the call made again takes this number
            raise
    CHKERR(MPI_Iallgather(sbuf, FP_BYTES, MPI_BYTE, rbuf, FP_BYTES, MPI_BYTE, w.priv, &req))
    try:
        poll_request(&req, w, comm, f"{what}: the other processes did not reach it "
                                    "(checked mode's fingerprint exchange)")
    except BaseException:
        # (a TimeoutError, Ctrl-C) the exchange stays posted, and MPI writes
        # the late processes' fingerprints into these buffers when they come
        stuck_exchanges.append((mine, everyone))
        raise
    return 0


cdef list stuck_exchanges = []    # buffers of exchanges left posted: MPI may still write them


cdef int poll_request(MPI_Request *req, _Watch w, Comm comm, str what) except -1:
    cdef int flag = 0, spins = 0
    cdef long long deadline = deadline_ns(w.timeout)
    while True:
        CHKERR(MPI_Test(req, &flag, MPI_STATUS_IGNORE))
        if flag:
            return 0
        if w.timeout > 0 and now_ns() > deadline:
            raise_timeout(w.timeout, f"waiting for {what} on {comm_label(w, comm.ob_mpi)}")
        idle(spins)
        spins += 1


def _meet(Comm comm, _MPI.Request meeting, str what):
    """Wait for `meeting` (an Ibarrier on `comm`): every process of `comm` has
    come to a collective step outside the call path (a backend's set-up, a
    communicator's constructor).
    Polled, so that Ctrl-C ends it, and TimeoutError at `comm`'s timeout, if
    any; the barrier stays pending then, and a second call waits for it again."""
    cdef int flag = 0, spins = 0
    cdef _Watch w = comm.watch
    cdef double timeout = w.timeout if w is not None else 0
    cdef long long deadline = deadline_ns(timeout)
    while True:
        CHKERR(MPI_Test(&meeting.ob_mpi, &flag, MPI_STATUS_IGNORE))
        if flag:
            return
        if timeout > 0 and now_ns() > deadline:
            _raise_timeout(comm, what)
        idle(spins)
        spins += 1


def _raise_timeout(Comm comm, str what):
    """Raise the TimeoutError of `comm`'s timeout for a wait outside the call
    path: "waiting for every process of <comm> <what>", with this process's
    pending calls."""
    cdef _Watch w = comm.watch
    if w is None or w.timeout <= 0:
        raise ValueError(f"{comm!r} has no timeout")
    raise_timeout(w.timeout, f"waiting for every process of {comm_label(w, comm.ob_mpi)} {what}")


def _raise_wait_timeout(Comm comm, str what):
    """Raise the TimeoutError of `comm`'s timeout for a wait of this process
    alone (a backend's blocking Probe): "waiting for <what> on <comm>"."""
    cdef _Watch w = comm.watch
    if w is None or w.timeout <= 0:
        raise ValueError(f"{comm!r} has no timeout")
    raise_timeout(w.timeout, f"waiting for {what} on {comm_label(w, comm.ob_mpi)}")


cdef int probe_timed(Comm comm, double timeout, int source, int tag,
                     MPI_Status *sp) except -1:
    """Probe under `comm`'s timeout: MPI_Iprobe, polled until the deadline."""
    cdef int flag = 0, spins = 0
    cdef long long deadline = deadline_ns(timeout)
    while True:
        CHKERR(MPI_Iprobe(source, tag, comm.ob_mpi, &flag, sp))
        if flag:
            return 0
        if now_ns() > deadline:
            _raise_wait_timeout(comm, f"Probe (source {source}, tag {tag}) [mpi]")
        idle(spins)
        spins += 1


# -- Records of calls ----------------------------------------------------------------

cdef enum:
    PEND_PENDING, PEND_DONE, PEND_FAILED

cdef tuple PEND_STATES = ("pending", "done", "failed")
cdef dict pending_recs = {}        # id -> _Pend: this process's pending calls
cdef object recent_recs = None     # the latest records (the recorder's ring)
cdef dict recorded_watches = {}    # label -> _Watch of the communicators recorded
cdef object dump_reason = None     # the first error dumped: (reason, message)


@cython.final
cdef class _Pend(_Observer):
    """One call, as the timeouts and the flight recorder see it; the
    observer of a non-blocking or persistent call's request."""
    cdef readonly str comm          # the communicator's label
    cdef readonly object seq        # collectives: the sequence number; else None
    cdef readonly int op, form
    cdef readonly str backend
    cdef readonly str desc
    cdef readonly int peer, root, tag
    cdef readonly long long nbytes
    cdef readonly long long t0, t1
    cdef readonly int state
    cdef double timeout             # seconds a wait for its request may last (0: no limit)

    cdef bint ended(self, int how) except -1:
        # freed: no longer waited for; dropped: pending till the operation
        # is over (the record follows it); else a persistent call's record
        # stays with its request, pending anew at each start
        if how != OBS_DROPPED:
            pend_end(self, PEND_FAILED if how == OBS_FAILED else PEND_DONE)
        return how == OBS_DROPPED or (how != OBS_FREED and self.form == PERSISTENT)

    cdef double limit(self) noexcept:
        return self.timeout

    cdef int restarted(self) except -1:
        return pend_restart(self)

    cdef dict as_dict(self, long long now):
        return {"comm": self.comm, "seq": self.seq, "op": call_name(self.op),
                "form": FORM_NAMES[self.form], "backend": self.backend, "desc": self.desc,
                "peer": self.peer, "root": self.root, "tag": self.tag,
                "bytes": self.nbytes, "state": PEND_STATES[self.state],
                "age": round((now - self.t0) / 1e9, 6),
                "duration": round((self.t1 - self.t0) / 1e9, 6)
                if self.state != PEND_PENDING else None}

    cdef str line(self, long long now):
        """"Allreduce float32[4] SUM #17 on world [mpi, blocking], 16 bytes, for 5.0 s"."""
        seq = f" #{self.seq}" if self.seq is not None else ""
        size = f", {self.nbytes} bytes" if self.nbytes >= 0 else ""
        return (f"{self.desc}{seq} on {self.comm} [{self.backend}, {FORM_NAMES[self.form]}]"
                f"{size}, for {(now - self.t0) / 1e9:.1f} s")


cdef str call_name(int op):
    """The method of `op`: a buffer call, one of COMM_CALL_NAMES or of OBJ_P2P_NAMES."""
    if op < CALL_COUNT:
        return CALL_NAMES[op]
    op -= CALL_COUNT
    return COMM_CALL_NAMES[op] if op < len(COMM_CALL_NAMES) else \
        OBJ_P2P_NAMES[op - len(COMM_CALL_NAMES)]


cdef str rank_text(int rank):
    """A source or destination in a record: a rank, "any" or "PROC_NULL"."""
    return "any" if rank == MPI_ANY_SOURCE else "PROC_NULL" if rank == MPI_PROC_NULL \
        else str(rank)


cdef str tag_text(int tag):
    return "any" if tag == MPI_ANY_TAG else str(tag)


cdef _Pend new_pend(Comm comm, _Watch w, _Call c, int form, str backend, long long seq):
    """The record of call `c`, posted now in `form` (or refused: unparsed)."""
    cdef long long f[FP_INTS]
    cdef int op = c.op
    fill_fingerprint(f, comm, c, form, backend, seq)
    cdef _Pend p = _Pend.__new__(_Pend)
    p.comm = comm_label(w, comm.ob_mpi)
    p.seq = seq if op >= CALL_BARRIER else None
    p.op, p.form, p.backend = op, form, backend
    p.peer = p.root = p.tag = -1
    if op <= CALL_SENDRECV_REPLACE:
        p.peer = int_or(c.source if op == CALL_RECV else c.dest, -1)
        p.tag = int_or(c.tag, -1)
        where = "from" if op == CALL_RECV else "to"
        p.desc = f"{CALL_NAMES[op]} {TYPE_NAMES[f[F_DTYPE]] if f[F_DTYPE] >= 0 else ''}" \
                 f"[{f[F_COUNT]}] {where} {rank_text(p.peer)} tag {tag_text(p.tag)}"
        if op == CALL_SENDRECV or op == CALL_SENDRECV_REPLACE:     # (what it waits for)
            p.desc += (f", from {rank_text(int_or(c.source, -1))} tag "
                       f"{tag_text(int_or(c.recvtag, -1))}")
    else:
        p.root = <int>f[F_ROOT]
        p.desc = fingerprint_text(f, False, False)
    p.nbytes = f[F_TSIZE] * max(f[F_COUNT], f[F_SEND], f[F_RECV], 0)
    return kept_pend(p, w)


cdef _Pend comm_call_pend(Comm comm, _Watch w, str call, long long seq, int root):
    """The record of a collective call outside the buffer methods (`call`,
    one of COMM_CALL_NAMES; `root`, or -1), made now: numbered among the
    collectives."""
    cdef _Pend p = _Pend.__new__(_Pend)
    p.comm = comm_label(w, comm.ob_mpi)
    p.seq = seq
    p.op, p.form, p.backend = CALL_COUNT + COMM_CALL_NAMES.index(call), BLOCKING, "mpi"
    p.peer = p.tag = -1
    p.root = root
    p.desc = call if root < 0 else f"{call} root={root}"
    p.nbytes = 0 if call in MADE_CALL_NAMES else -1     # (-1: a size mcr does not see)
    return kept_pend(p, w)


cdef _Pend obj_p2p_pend(Comm comm, _Watch w, int call, object peer, object tag,
                        object source, object recvtag):
    """The record of mpi4py's point-to-point method `call` (one of
    OBJ_P2P_NAMES) made now: not numbered; its size unknown (-1) until the
    object is pickled or the message matched."""
    cdef _Pend p = _Pend.__new__(_Pend)
    p.comm = comm_label(w, comm.ob_mpi)
    p.seq = None
    p.op, p.backend = CALL_COUNT + len(COMM_CALL_NAMES) + call, "mpi"
    p.form = NONBLOCKING if call >= P2P_ISEND else BLOCKING
    p.peer, p.tag, p.root = int_or(peer, -1), int_or(tag, -1), -1
    name = OBJ_P2P_NAMES[call]
    if call == P2P_SEND or call == P2P_SSEND or call == P2P_ISEND or call == P2P_ISSEND:
        p.desc = f"{name} to {rank_text(p.peer)} tag {tag_text(p.tag)}"
    elif call == P2P_SENDRECV:
        p.desc = (f"{name} to {rank_text(p.peer)} tag {tag_text(p.tag)}, from "
                  f"{rank_text(int_or(source, -1))} tag {tag_text(int_or(recvtag, -1))}")
    else:
        p.desc = f"{name} from {rank_text(p.peer)} tag {tag_text(p.tag)}"
    p.nbytes = -1
    return kept_pend(p, w)


cdef _Pend kept_pend(_Pend p, _Watch w):
    """`p`, started now: pending, and in the recorder's ring when it is on."""
    global recent_recs
    p.t0 = now_ns()
    p.state = PEND_PENDING
    pending_recs[id(p)] = p
    if recorder_on:
        if recent_recs is None:
            recent_recs = _deque(maxlen=FLIGHT_KEEP)
            _atexit.register(_flight_exit)
        recent_recs.append(p)
        recorded_watches[p.comm] = w
    return p


cdef int pend_end(_Pend p, int state) except -1:
    if p.state == PEND_PENDING:
        p.state = state
        p.t1 = now_ns()
        pending_recs.pop(id(p), None)
    return 0


cdef int pend_refused(_Pend p, object err) except -1:
    """`p`, a call whose arguments this process refused (`err`): failed, and
    its description says so (it has no element type or counts)."""
    p.desc += f" refused ({type(err).__name__})"
    return pend_end(p, PEND_FAILED)


cdef int pend_restart(_Pend p) except -1:
    """A persistent request started again: its record is pending anew."""
    p.state = PEND_PENDING
    p.t0 = now_ns()
    pending_recs[id(p)] = p
    if recent_recs is not None:
        recent_recs.append(p)
    return 0


cdef list pending_dicts():
    cdef long long now = now_ns()
    return [(<_Pend>p).as_dict(now)
            for p in sorted(pending_recs.values(), key=lambda p: (<_Pend>p).t0)]


cdef int raise_timeout(double timeout, str what) except -1:
    cdef long long now = now_ns()
    recs = sorted(pending_recs.values(), key=lambda p: (<_Pend>p).t0)
    cdef int rank = 0
    MPI_Comm_rank(MPI_COMM_WORLD, &rank)
    listing = "".join(f"\n  {(<_Pend>p).line(now)}" for p in recs) or " none recorded"
    message = (f"rank {rank}: no completion after {timeout:g} s (the communicator's "
               f"timeout) {what}. Pending calls of this process, oldest first:{listing}")
    flight_dump("timeout", message)
    raise _errors.TimeoutError(message, pending_dicts())


# -- Timed waits ------------------------------------------------------------------

cdef _Pend pend_of(Request req):
    """The call's record among `req`'s observers, or None."""
    cdef _Observer o = req.obs
    while o is not None and type(o) is not _Pend:
        o = o.next_obs
    return <_Pend>o


@cython.final
cdef class _Limit(_Observer):
    """A time limit on the waits of a request that has no record."""
    cdef double timeout

    def __cinit__(self, double timeout):
        self.timeout = timeout

    cdef bint ended(self, int how) except -1:
        return how != OBS_FREED

    cdef double limit(self) noexcept:
        return self.timeout


cdef int attach_pend(Request req, _Pend p, double timeout) except -1:
    """`p` (None: no record) follows `req`, whose waits last at most
    `timeout` seconds (0: no limit)."""
    if p is not None:
        p.timeout = timeout
        observe(req, p)
    return 0


cdef str request_what(Request req):
    cdef _Pend p = pend_of(req)
    if p is not None:
        seq = f" #{p.seq}" if p.seq is not None else ""
        return f"waiting for {p.desc}{seq} on {p.comm} [{p.backend}]"
    cdef _Observer o = req.obs
    while o is not None:            # (a fused call's: mcr.Fusion names it)
        what = o.describe()
        if what is not None:
            return f"waiting for {what}"
        o = o.next_obs
    return "waiting for a request"


cdef object timed_wait(Request req, object status):
    """Request.Wait with a timeout: poll until the request completes."""
    try:
        polled([req], lambda: (req.Test(status), True))
    except _errors.TimeoutError:
        raise
    except BaseException:
        if req.obs is not None:             # the backend reported an error
            notify(req, OBS_FAILED)
        raise
    return True


cdef int timed_out(list requests, double timeout) except -1:
    """A wait for `requests` lasted `timeout` seconds: TimeoutError naming
    those still pending."""
    waiting = [request_what(<Request>r) for r in requests if isinstance(r, Request) and r]
    raise_timeout(timeout, "; ".join(waiting) or "waiting for requests")


# -- mpi4py's point-to-point methods on pickled objects ------------------------------

cdef object meet(Comm comm, str call, int root=-1, _Call c=None, object refused=None):
    """Before a collective call outside the buffer methods (`call`, one
    of COMM_CALL_NAMES: one that makes or frees a communicator, one of
    mpi4py's methods on pickled objects, or a neighborhood collective;
    `root`, or -1), as MPI's block
    and cannot be interrupted. Watched, it takes the next number in the
    sequence of collectives, and a record with a timeout or the recorder
    (returned, pending; else None). Checked, the processes agree on it as
    on a collective (check_comm_call, polled: a TimeoutError at the
    timeout); else, with a timeout, they meet in a polled barrier (except
    for UNAWAITED_CALLS: Free, which does not block, and the non-blocking
    and persistent calls). A TimeoutError leaves the exchange or barrier
    pending, for the next try, which takes the same number. `refused`: this
    process's refusal of the call's arguments (checked only: nb_refused),
    which travels in its fingerprint."""
    cdef _Watch w = comm.watch
    if comm.ob_mpi == MPI_COMM_NULL:
        return None                 # (mpi4py's method raises MPI's error)
    if w is None and recorder_on and not comm.unlogged:
        w = comm.recorded_watch()
    if w is None or comm.unlogged:
        return None
    if comm.idups:
        settle_idups(comm)
    w.seq += 1
    p = comm_call_pend(comm, w, call, w.seq, root) if w.timeout > 0 or recorder_on \
        else None
    try:
        if w.checked:
            check_comm_call(comm, w, call, root, c, refused)
        elif w.timeout > 0 and call not in UNAWAITED_CALLS:
            if comm.meeting is None:
                comm.meeting = _MPI.Intracomm.Ibarrier(comm)
            why = "a neighborhood collective" if call.startswith("Neighbor_") else \
                "making a communicator is collective" if call[0].isupper() else \
                "a collective on pickled objects"
            try:
                _meet(comm, comm.meeting, f"to call {call} ({why})")
            except BaseException:
                w.seq -= 1      # the barrier stays posted: the next try takes this number
                raise
            comm.meeting = None
    except BaseException:
        if p is not None and refused is not None:
            pend_refused(<_Pend>p, refused)
        elif p is not None:
            pend_end(<_Pend>p, PEND_FAILED)
        raise
    return p


cdef int settle_idups(Comm comm) except -1:
    """Before a watched collective on `comm`: wait for the Idups of `comm` still pending
    (bounded by their timeout). Open MPI posts an Idup's rounds on its parent as progress
    finds them, so the non-blocking collectives a watched call posts (its own form under a
    timeout, checked mode's exchange, a constructor's barrier) could come before a round on
    some processes and after it on others: MPI_ERR_TRUNCATE, a hang. Every process of
    `comm` makes the same collectives, so every one waits here too."""
    cdef list idups = comm.idups
    while idups:
        (<Request>idups[0]).Wait()
        del idups[0]
    return 0


cdef object watched_comm_call(Comm comm, _Call c, Py_ssize_t i):
    """A collective call outside the buffer methods, the i-th interceptor's:
    after meet (its number, its record; checked, the processes agree on
    it; for Create_group, group_pend: its record only), its record ended
    as it returns or raises; a non-blocking one's request as an mcr Request
    with the record and the timeout."""
    p = group_pend(comm, c.callname) if c.kind == COMM_GROUP else \
        meet(comm, c.callname, c.iroot, c)
    if p is not None:
        (<_Pend>p).backend = c.name     # (a neighbourhood collective composed on a backend)
    try:
        if comm.watch is not None and comm.watch.checked and c.callname in NB_SIZED_NAMES:
            nb_sizes_agree(comm, c.callname, c.makeargs)     # (neighbor.pxi)
        result = proceed(comm, c, i + 1)
    except BaseException:
        if p is not None:
            pend_end(<_Pend>p, PEND_FAILED)
        if c.callname == "Free" and comm.watch is not None and not comm.unlogged:
            # not freed (a sub-communicator timed out): its barrier stays
            # posted, and Free made again waits for it, as this number
            comm.watch.seq -= 1
        raise
    if c.kind == COMM_MADE or c.kind == COMM_GROUP:
        if p is not None:
            pend_end(<_Pend>p, PEND_DONE)
        return result
    if c.kind == COMM_STARTED:
        return (result[0], watched_request(comm, p, result[1]))
    if c.kind == COMM_PERSISTENT:
        return watched_prequest(comm, p, result)
    return watched_request(comm, p, result)


cdef int nb_refused(Comm comm, _Call c, object err) except -1:
    """Raise `err`, this process's refusal of the arguments of neighbourhood
    call `c` (nb_refusal), before the call meets the others. Checked, they
    agree on the call first, the refusal in this process's fingerprint, so
    that every process raises before any communicates (the others would wait
    in the fingerprint exchange, or, composed on a backend, in its size
    exchange, which no timeout bounds). Unchecked, a timeout's barrier is
    where the others time out."""
    if comm.watch is not None and comm.watch.checked:
        meet(comm, nb_method(c.op - CALL_COUNT, c.form), -1, None, err)
    raise err


cdef object group_pend(Comm comm, str call):
    """Before `call` (Create_group), made by the processes of a group of
    `comm` only: its record with a timeout or the recorder (else None), not
    numbered among the collectives, since the others do not take part, and
    neither agreed on nor bounded by the timeout (MPI's call blocks)."""
    cdef _Watch w = comm.watch
    if comm.ob_mpi == MPI_COMM_NULL or comm.unlogged:
        return None
    if w is None:
        w = comm.recorded_watch() if recorder_on else None
    if w is None or not (w.timeout > 0 or recorder_on):
        return None
    cdef _Pend p = comm_call_pend(comm, w, call, 0, -1)
    p.seq = None
    return p


cdef object watched_request(Comm comm, object p, object request):
    """The request of a non-blocking call that `meet` recorded as `p` (None:
    not watched, the request as it is): an mcr Request with the record and
    the communicator's timeout."""
    if p is None:
        return request
    (<_Pend>p).form = NONBLOCKING
    if isinstance(request, Request):         # mcr's own (a composed call)
        attach_pend(<Request>request, <_Pend>p, comm.watch.timeout)
        return request
    return as_mcr_request(request, comm.watch.timeout, <_Pend>p)


cdef Prequest watched_prequest(Comm comm, object p, Prequest preq):
    """The persistent request of a call that `meet` recorded as `p` (None:
    not watched): the record follows it, pending anew at each Start, and
    its waits last at most the communicator's timeout."""
    if p is not None:
        (<_Pend>p).form = PERSISTENT
        pend_end(<_Pend>p, PEND_DONE)
        attach_pend(preq, <_Pend>p, comm.watch.timeout)
    return preq


cdef int name_p2p(_Call c) except -1:
    """Name the arguments of mpi4py's point-to-point method `c` (in
    c.makeargs, in the method's order): the object sent is `sendbuf`, a
    receive's `buf` is `recvbuf`, sendrecv's sendtag is `tag`."""
    cdef int call = c.p2p
    if call == P2P_SEND or call == P2P_SSEND or call == P2P_ISEND or call == P2P_ISSEND:
        c.sendbuf, c.dest, c.tag = c.makeargs
    elif call == P2P_RECV:
        c.recvbuf, c.source, c.tag, c.status = c.makeargs
    elif call == P2P_IRECV:
        c.recvbuf, c.source, c.tag = c.makeargs
    elif call == P2P_SENDRECV:
        c.sendbuf, c.dest, c.tag, c.recvbuf, c.source, c.recvtag, c.status = c.makeargs
    else:                                       # probe, mprobe
        c.source, c.tag, c.status = c.makeargs
    return 0


cdef _Pend p2p_pend(Comm comm, _Watch w, _Call c):
    """The record of mpi4py's point-to-point call `c`."""
    cdef int call = c.p2p
    cdef bint sends = call == P2P_SEND or call == P2P_SSEND or call == P2P_ISEND or \
        call == P2P_ISSEND or call == P2P_SENDRECV
    return obj_p2p_pend(comm, w, call, c.dest if sends else c.source, c.tag,
                        c.source if call == P2P_SENDRECV else None, c.recvtag)


cdef object obj_p2p(Comm comm, _Call c, Py_ssize_t i):
    """mpi4py's point-to-point method `c` (one of OBJ_P2P_NAMES; its
    arguments named by name_p2p), the i-th interceptor's. With a timeout or
    the recorder, the call gets a record. With a timeout, it is polled: a
    send is posted non-blocking (isend, issend) and waited for as a Request
    (a TimeoutError carries it as `request`, pending); a receive or probe
    tests for a matching message (improbe, iprobe) until one comes (at the
    timeout, nothing is left posted), then receives it (the message is
    matched: its sender has sent it). A receive's `buf` only bounds the
    message then: a longer one is received and raises MPI's truncation
    error, as mpi4py's receive into `buf` does. A sendrecv whose send times
    out after its receive completed gives the object received with the
    TimeoutError (`received`)."""
    cdef int call = c.p2p
    cdef _Watch w = p2p_watch(comm)
    if w is None:
        return proceed(comm, c, i + 1)
    cdef double timeout = w.timeout
    cdef _Pend p = p2p_pend(comm, w, c)
    room = c.recvbuf                # (a receive's buf, sendrecv's recvbuf)
    if timeout > 0 and room is not None:
        import warnings             # (as mpi4py's own methods warn)
        warnings.warn("the 'buf' argument is deprecated", UserWarning)
    cdef Request sent = None
    cdef long long deadline = deadline_ns(timeout)
    cdef int spins = 0, nbytes = -1
    cdef bint got = False
    try:
        if timeout == 0:
            result = proceed(comm, c, i + 1)
        else:
            # (before anything moves; mpi4py reads no buf for PROC_NULL)
            room_bytes = None if room is None or c.source == _mpi4py.PROC_NULL else \
                room_size(room)
            if call == P2P_SEND or call == P2P_SSEND or call == P2P_SENDRECV:
                sent = as_mcr_request((_obj_issend if call == P2P_SSEND else _obj_isend)(
                    comm, c.sendbuf, c.dest, c.tag), timeout, p)
                if call != P2P_SENDRECV:
                    timed_wait(sent, None)          # (it ends the record)
                    return None
                sent.obs = None                     # (the record ends with the receive)
                observe(sent, _Limit.__new__(_Limit, timeout))
            st = c.status if c.status is not None or call == P2P_PROBE else _MPI.Status()
            rtag = c.recvtag if call == P2P_SENDRECV else c.tag     # (the receive's tag)
            while True:
                if call == P2P_PROBE:
                    found = _obj_iprobe(comm, c.source, rtag, st) or None
                else:
                    found = _obj_improbe(comm, c.source, rtag, st)
                if found is not None:
                    break
                if now_ns() > deadline:
                    raise_timeout(timeout, f"waiting for {p.desc} on {p.comm} [mpi]")
                idle(spins)
                spins += 1
            if call != P2P_PROBE:
                MPI_Get_count(&(<_MPI.Status>st).ob_mpi, MPI_BYTE, &nbytes)
                p.nbytes = nbytes
            result = True if call == P2P_PROBE else found if call == P2P_MPROBE else \
                _msg_recv(found, c.status)
            got = True
            if room_bytes is None:
                room_bytes = nbytes
            if sent is not None:
                timed_wait(sent, None)
            if nbytes > room_bytes:
                exc = Exception(MPI_ERR_TRUNCATE)
                add_note(exc, f"{'recvbuf' if call == P2P_SENDRECV else 'buf'}: the message "
                              f"of {nbytes} bytes (pickled) is longer than the buffer's "
                              f"{room_bytes}")
                raise exc
    except _errors.TimeoutError as exc:
        if sent is not None:
            exc.request = sent            # the send, pending: to wait for it again
            if got:
                exc.received = result     # (its receive completed)
        if sent is None or pend_of(sent) is None:
            pend_end(p, PEND_FAILED)      # (a send's record stays pending with it)
        raise
    except BaseException:
        pend_end(p, PEND_FAILED)
        raise
    pend_end(p, PEND_DONE)
    return result


cdef object room_size(object room):
    """The bytes a pickled receive's `buf` holds: a buffer's size, or an
    integer (mpi4py allocates that many); TypeError for anything else, as
    mpi4py's receive raises before it receives."""
    try:
        return operator_index(room)
    except TypeError:
        return memoryview(room).nbytes


cdef object obj_posted(Comm comm, _Call c, Py_ssize_t i):
    """mpi4py's non-blocking method `c` (isend, issend, irecv), the i-th
    interceptor's: with a timeout or the recorder, its request as an mcr
    Request with the timeout and a record (pending until a wait or test
    completes it: Request.wait and the other lowercase methods unpickle a
    received object as mpi4py's do)."""
    cdef _Watch w = p2p_watch(comm)
    if w is None:
        return proceed(comm, c, i + 1)
    cdef _Pend p = p2p_pend(comm, w, c)
    try:
        q = proceed(comm, c, i + 1)
    except BaseException:
        pend_end(p, PEND_FAILED)
        raise
    return as_mcr_request(q, w.timeout, p)


cdef _Watch p2p_watch(Comm comm):
    """The watch under which mpi4py's point-to-point calls on `comm` get a
    record (it has a timeout, or the recorder is on), or None: they run as
    mpi4py's (checked mode alone compares collectives only)."""
    if comm.unlogged or comm.ob_mpi == MPI_COMM_NULL:
        return None
    if comm.watch is not None and comm.watch.timeout > 0:
        return comm.watch
    return comm.recorded_watch() if recorder_on else None


cdef Request as_mcr_request(object request, double timeout, _Pend p):
    """mpi4py's `request` (on pickled objects, or a neighborhood
    collective's) as an mcr Request with `timeout` and the record `p` (its
    size: a pickled object's; None: no record), its handle and message moved
    over, so that a dropped one keeps them until MPI is done with them (see
    dropped)."""
    cdef _MPI.Request q = <_MPI.Request?>request
    cdef Request r = Request.__new__(Request)
    r.ob_mpi, q.ob_mpi = q.ob_mpi, MPI_REQUEST_NULL
    r.ob_buf, q.ob_buf = q.ob_buf, None
    attach_pend(r, p, timeout)
    if p is not None:
        try:
            p.nbytes = len(r.ob_buf)
        except TypeError:
            pass
    return r


# -- The flight recorder -------------------------------------------------------------

cdef int flight_dump(str reason, str message) except -1:
    """Write this process's records to $MCR_FLIGHT_RECORDER/mcr-flight-<rank>.json
    (the first error's reason and message are kept in later dumps)."""
    global dump_reason
    if not recorder_on:
        return 0
    if dump_reason is None and reason != "exit":
        dump_reason = (reason, message)
    reason, message = dump_reason if dump_reason is not None else (reason, message)
    cdef int rank = 0, size = 1, initialized = 0, finalized = 0
    MPI_Initialized(&initialized)
    MPI_Finalized(&finalized)
    if initialized and not finalized:
        MPI_Comm_rank(MPI_COMM_WORLD, &rank)
        MPI_Comm_size(MPI_COMM_WORLD, &size)
    cdef long long now = now_ns()
    recs = {id(p): p for p in (recent_recs or ())}
    recs.update(pending_recs)
    ordered = sorted(recs.values(), key=lambda p: (<_Pend>p).t0)
    comms = {}
    for label, w in recorded_watches.items():
        seqs = [(<_Pend>p).seq for p in ordered
                if (<_Pend>p).comm == label and (<_Pend>p).seq is not None]
        comms[label] = {"members": (<_Watch>w).members, "next_seq": (<_Watch>w).seq + 1,
                        "first_seq": min(seqs) if seqs else (<_Watch>w).seq + 1}
    launch = service("launch")   # its job_name(): which names the launchers give
    record = {"version": 1, "rank": rank, "size": size, "job": launch.job_name(),
              "host": _socket.gethostname(),
              "pid": _os.getpid(), "time": _time.time(), "reason": reason,
              "message": message, "comms": comms,
              "calls": [(<_Pend>p).as_dict(now) for p in ordered]}
    try:
        _os.makedirs(FLIGHT_DIR, exist_ok=True)
        path = _os.path.join(FLIGHT_DIR, f"mcr-flight-{rank}.json")
        with open(path + ".tmp", "w") as out:
            _json.dump(record, out, indent=1)
        _os.replace(path + ".tmp", path)
    except OSError as exc:
        import warnings
        warnings.warn(f"MCR_FLIGHT_RECORDER: cannot write {FLIGHT_DIR!r}: {exc}")
    return 0


def _flight_exit():
    flight_dump("exit", "")


def _flight_dump(reason="request", message=""):
    """Write the flight recorder's file now (with $MCR_FLIGHT_RECORDER set)."""
    flight_dump(reason, message)


settings_changed()     # the recorder, when $MCR_FLIGHT_RECORDER is set


def _set_flight_recorder(path):
    """Turn the flight recorder on (records written under `path`) or off
    (None): what $MCR_FLIGHT_RECORDER does at start-up (mcr.bench.check)."""
    global FLIGHT_DIR, recorder_on
    FLIGHT_DIR = None if path is None else _os.fspath(path)
    recorder_on = FLIGHT_DIR is not None
    settings_changed()


@cython.final
cdef class _Watched(Interceptor):
    """Checked mode, timeouts and the flight recorder on a buffer call: a
    collective first agrees on its fingerprint when checked; the call gets a
    record when timed or recorded; a blocking call with a timeout runs as its
    non-blocking form and a timed wait. (mcr's private communicators are not
    watched.)"""

    cdef bint applies_to(self, Comm comm) except -1:
        return not comm.unlogged and (recorder_on or (comm.watch is not None and (
            comm.watch.checked or comm.watch.timeout > 0)))

    cdef object run_call(self, Comm comm, _Call c, Py_ssize_t i):
        if OP_TABLE[c.op].flags & OP_NEIGHBOR:    # (meet, inside: Comm.made)
            refused = nb_refusal(comm, c)          # (neighbor.pxi)
            if refused is not None:
                nb_refused(comm, c, refused)
            return proceed(comm, c, i + 1)
        if c.op == COMM_OP:
            return watched_comm_call(comm, c, i)
        if c.op == COMM_P2P_OP:
            return obj_p2p(comm, c, i) if c.kind == COMM_P2P else obj_posted(comm, c, i)
        cdef _Watch w = comm.recorded_watch()
        cdef _Pend p = None
        cdef Request req
        cdef long long seq = 0
        cdef bint collective = not OP_TABLE[c.op].flags & OP_P2P
        cdef int form = c.form
        if collective and comm.idups:
            settle_idups(comm)
        if collective:
            w.seq += 1
            seq = w.seq
        cdef bint timed = w.timeout > 0 and form == BLOCKING
        cdef bint record = w.timeout > 0 or recorder_on
        if collective and w.checked:
            # (the form it runs in: MPI matches blocking collectives only with blocking ones)
            p = check_collective(comm, w, c, i, NONBLOCKING if timed else form, c.name,
                                 record)
        elif record:
            try:
                comm.parse(c)
            except _builtins.Exception as exc:
                # a refused collective is recorded: it has taken its number
                if collective and comm.ob_mpi != MPI_COMM_NULL:
                    pend_refused(new_pend(comm, w, c, form, c.name, seq), exc)
                raise
            p = new_pend(comm, w, c, form, c.name, seq)
        status = c.status
        if timed:
            c.form, c.status = NONBLOCKING, None
        try:
            result = proceed(comm, c, i + 1)
        except BaseException:
            if p is not None:
                pend_end(p, PEND_FAILED)
            raise
        if form == BLOCKING and not timed:
            if p is not None:
                pend_end(p, PEND_DONE)
            return result
        req = <Request>result
        if form == PERSISTENT and p is not None:
            pend_end(p, PEND_DONE)        # pending again at each Start
            if isinstance(req, Prequest) and (<Prequest>req).start_fn is not None \
                    and (<Prequest>req).op == 0:
                # emulated: each start's is that of the call it posts on the chain (a
                # compressed one, whose starts post outside it, keeps this one)
                return result
        attach_pend(req, p, w.timeout)
        if timed:
            if c.rec is not None:     # the logger saw the form posted here, not the program's
                (<_Rec>c.rec).form = BLOCKING
            try:
                req.Wait(status)
            except _errors.TimeoutError as exc:
                exc.request = req             # to wait for it again, or to free it
                raise
            return None
        return result


_register(_Watched(50, "checked mode, timeouts, flight recorder"))


# -- a Fusion's calls (fuseimpl.pxi): their waits are bounded by the communicator's timeout

cdef int watch_fused(Request req, Comm comm, list handles, Py_ssize_t index) except -1:
    """Give fused call `index`'s request (waiting on `handles`, [its bucket])
    the time limit of `comm`'s timeout, when it has one."""
    cdef _Watch watch = comm.watch
    cdef _FusedCall o
    if watch is not None and watch.timeout > 0:
        o = _FusedCall.__new__(_FusedCall)
        o.timeout, o.handles, o.index, o.comm = watch.timeout, handles, index, comm
        req.obs = o
    return 0


@cython.final
cdef class _FusedCall(_Observer):
    """The time limit of a fused call's request (its communicator's timeout
    when the call was made), and what a timed-out wait for it waits for,
    as its bucket says (``describe``: the bucket not yet decided by rank 0,
    or its bucket's collective not complete)."""
    cdef double timeout
    cdef list handles           # [its bucket], as its request's work holds it
    cdef Py_ssize_t index       # the call's position in the fusion's sequence
    cdef Comm comm

    cdef bint ended(self, int how) except -1:
        return how != OBS_FREED

    cdef double limit(self) noexcept:
        return self.timeout

    cdef str describe(self):
        bucket = self.handles[0]
        w = self.comm.watch
        label = comm_label(w, self.comm.ob_mpi) if w is not None else repr(self.comm)
        return bucket.describe(self.index, label)


def _fusion_wait(Comm comm, _MPI.Request req, object what):
    """Wait for `req`, a message of an mcr.Fusion on `comm` (a decision of
    rank 0), polled, driving MPI and the progress engine: TimeoutError at
    `comm`'s timeout, "waiting for " ``what(label)``, `label` naming `comm`
    (`what` is called only then). For a communicator with a timeout: MPI's
    own wait cannot be interrupted."""
    cdef int flag = 0, spins = 0
    cdef _Watch w = comm.watch
    cdef double timeout = w.timeout if w is not None else 0
    cdef long long deadline = deadline_ns(timeout)
    while True:
        CHKERR(MPI_Test(&req.ob_mpi, &flag, MPI_STATUS_IGNORE))
        if flag:
            return
        if timeout > 0 and now_ns() > deadline:
            raise_timeout(timeout, f"waiting for {what(comm_label(w, comm.ob_mpi))}")
        idle(spins)
        spins += 1
