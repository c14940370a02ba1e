# Message specs: every form mpi4py accepts, plus [buf, counts, displs].
# A message is parsed into a `side` (address, count(s), datatype) and checked
# against the buffer it points into before any MPI call.

cimport cython
from cpython.long cimport PyLong_AsLongAndOverflow

cdef object IN_PLACE = _mpi4py.IN_PLACE
cdef object BOTTOM = _mpi4py.BOTTOM


cdef struct side:
    char *addr
    int count            # simple messages: elements to move
    int *counts          # vector messages: per-process counts and displacements
    int *displs
    int nblocks          # entries of counts (and of displs, when not NULL); else 0
    MPI_Datatype dtype
    int tindex           # element type; -1 when the datatype is not in TYPES
    Py_ssize_t nelems    # elements available from the start of the buffer
    Py_ssize_t extent    # bytes per element
    bint explicit        # the count was given (per process in block collectives)
    int device           # CUDA device ordinal of the buffer, -1 for host memory


cdef enum:
    SMALL_BLOCKS = 16       # vector messages of up to this many processes: arrays in _Call


@cython.freelist(16)
cdef class _Ints:
    """A C array of ints (counts or displacements) owned by a message; small
    ones (up to 16 processes) live in the object itself."""
    cdef int *data
    cdef Py_ssize_t n
    cdef int small[16]

    def __dealloc__(self):
        if self.data != self.small:
            PyMem_Free(self.data)


cdef _Ints new_ints(Py_ssize_t n):
    cdef _Ints a = _Ints.__new__(_Ints)
    if n <= 16:
        a.data = a.small
    else:
        a.data = <int*>PyMem_Malloc(n * sizeof(int))
        if a.data == NULL:
            raise MemoryError
    a.n = n
    return a


cdef inline str argstr(const char *arg):
    return arg.decode()


cdef inline int item_count(object value, const char *arg, str what, Py_ssize_t i) except -1:
    """Entry `i` of a counts or displacements list; the name `what[i]` is only
    formatted for the error (a list of small ints is the common case)."""
    cdef int overflow = 0
    cdef long n
    if type(value) is int:
        n = PyLong_AsLongAndOverflow(value, &overflow)
        if not overflow and 0 <= n <= INT_MAX:
            return <int>n
    return as_count(value, arg, f"{what}[{i}]")


cdef int as_count(object value, const char *arg, str what) except -1:
    try:
        n = value.__index__()
    except AttributeError:
        raise TypeError(f"{argstr(arg)}: {what} must be an integer, "
                        f"got {type(value).__name__}") from None
    if n < 0:
        raise ValueError(f"{argstr(arg)}: {what} must be non-negative, got {n}")
    if n > INT_MAX:
        raise OverflowError(f"{argstr(arg)}: {what} {n} exceeds the MPI limit {INT_MAX}")
    return n


cdef inline bint is_datatype(object x):
    return isinstance(x, (_MPI.Datatype, str))


cdef int set_datatype(side *x, object datatype, const char *arg) except -1:
    """Give the message an explicit datatype (mpi4py Datatype or typecode)."""
    cdef MPI_Aint lb = 0, extent = 0
    cdef int tindex
    if isinstance(datatype, str):
        tindex = FORMAT_TO_TYPE.get(datatype, -1)
        if tindex < 0:
            mpi4py_type = _mpi4py._typedict.get(datatype)
            if mpi4py_type is None:
                raise UnknownTypecodeError(f"{argstr(arg)}: unknown typecode {datatype!r}; "
                                           f"known: {' '.join(sorted(FORMAT_TO_TYPE))}")
            return set_datatype(x, mpi4py_type, arg)
        x.dtype = TYPES[tindex].mpi
        x.tindex = tindex
        x.extent = TYPES[tindex].itemsize
        return 0
    if not isinstance(datatype, _MPI.Datatype):
        raise TypeError(f"{argstr(arg)}: datatype must be an MPI.Datatype or a typecode "
                        f"string, got {type(datatype).__name__}")
    cdef MPI_Datatype dt = (<_MPI.Datatype>datatype).ob_mpi
    if dt == MPI_DATATYPE_NULL:
        raise ValueError(f"{argstr(arg)}: datatype is MPI.DATATYPE_NULL")
    CHKERR(MPI_Type_get_extent(dt, &lb, &extent))
    if extent <= 0:
        raise ValueError(f"{argstr(arg)}: datatype extent {extent} is not positive")
    x.dtype = dt
    x.tindex = datatype_type_index(dt)
    x.extent = extent
    return 0


cdef int set_buffer(side *x, bufinfo *b, object datatype, const char *arg) except -1:
    """Point the message at a buffer, with its own or an explicit element type.
    As in mpi4py, an explicit datatype is trusted: the buffer is its bytes,
    counted in the datatype's extent (as_buffer did not read its format)."""
    x.addr = b.addr
    x.device = b.device
    x.counts = x.displs = NULL
    if datatype is None:
        x.dtype = TYPES[b.tindex].mpi
        x.tindex = b.tindex
        x.extent = TYPES[b.tindex].itemsize
    else:
        set_datatype(x, datatype, arg)
    x.nelems = b.nbytes // x.extent
    return 0


cdef int infer_count(side *x, Py_ssize_t nbytes, const char *arg) except -1:
    if nbytes % x.extent:
        raise ValueError(f"{argstr(arg)}: cannot infer count, buffer length {nbytes} "
                         f"is not a multiple of datatype extent {x.extent}")
    if x.nelems > INT_MAX:
        raise OverflowError(f"{argstr(arg)}: {x.nelems} elements exceed the MPI count "
                            f"limit {INT_MAX}")
    x.count = <int>x.nelems
    return 0


cdef object parse_simple(object spec, side *x, bint writable, const char *arg):
    """Parse buf | [buf, count] | [buf, datatype] | [buf, count, datatype] |
    [buf, (count, displ)] | [buf, (count, displ), datatype] |
    [buf, count, displ, datatype]. Return the object keeping the buffer alive."""
    cdef bufinfo b
    if type(spec) is _Tensor:                    # the hot path: a plain tensor
        tensor_info(spec, &b, arg)
        x.addr = b.addr
        x.device = b.device
        x.dtype = TYPES[b.tindex].mpi
        x.tindex = b.tindex
        x.extent = TYPES[b.tindex].itemsize
        x.nelems = b.nbytes // x.extent
        if x.nelems > INT_MAX:
            infer_count(x, b.nbytes, arg)
        x.count = <int>x.nelems
        x.explicit = False
        return spec
    if spec is None:                             # an empty message, as in mpi4py
        set_null(x)
        return None
    if spec is IN_PLACE:
        reject_in_place(arg)
    if not isinstance(spec, (list, tuple)):
        owner = as_buffer(spec, &b, writable, False, arg)
        set_buffer(x, &b, None, arg)
        infer_count(x, b.nbytes, arg)
        x.explicit = False
        return owner
    n = len(spec)
    if not 1 <= n <= 4:
        raise ValueError(f"{argstr(arg)}: message must have 1 to 4 items, got {n}")
    count = displ = datatype = None
    if n == 2:
        if is_datatype(spec[1]):
            datatype = spec[1]
        elif isinstance(spec[1], (list, tuple)):
            count, displ = pair(spec[1], arg)
        else:
            count = spec[1]
    elif n == 3:
        if isinstance(spec[1], (list, tuple)):
            (count, displ), datatype = pair(spec[1], arg), spec[2]
        elif is_datatype(spec[2]) or spec[2] is None:
            count, datatype = spec[1], spec[2]
        else:
            count, displ = spec[1], spec[2]
    elif n == 4:
        count, displ, datatype = spec[1], spec[2], spec[3]
    if spec[0] is None or spec[0] is BOTTOM:
        empty_message(x, spec[0], count, displ, datatype, arg)
        return None
    if spec[0] is IN_PLACE:
        reject_in_place(arg)
    owner = as_buffer(spec[0], &b, writable, datatype is not None, arg)
    set_buffer(x, &b, datatype, arg)
    cdef Py_ssize_t offset = 0 if displ is None else as_count(displ, arg, "displacement")
    if count is None:
        infer_count(x, b.nbytes, arg)
        if offset > x.count:
            raise ValueError(f"{argstr(arg)}: displacement {offset} is past the end of "
                             f"the buffer of {x.count} elements")
        x.count -= offset
    else:
        x.count = as_count(count, arg, "count")
        if offset + x.count > x.nelems:
            raise ValueError(f"{argstr(arg)}: count {x.count} at displacement {offset} "
                             f"reaches past the buffer of {x.nelems} elements")
    x.addr += offset * x.extent
    x.nelems -= offset
    x.explicit = count is not None
    return owner


cdef int reject_in_place(const char *arg) except -1:
    raise ValueError(f"{argstr(arg)}: IN_PLACE is not a buffer; it is only valid as the "
                     "sendbuf of a collective (the recvbuf of Scatter at its root)")


cdef int empty_message(side *x, object buf, object count, object displ, object datatype,
                       const char *arg) except -1:
    """[None | BOTTOM, ...]: a message of no elements, as in mpi4py (which also
    takes BOTTOM with absolute addresses in a derived datatype; mcr cannot
    check those, so it refuses a count)."""
    set_null(x)
    if datatype is not None:
        set_datatype(x, datatype, arg)
    x.addr = NULL
    x.nelems = 0
    name = "None" if buf is None else "BOTTOM"
    if count is not None and as_count(count, arg, "count") > 0:
        raise ValueError(f"{argstr(arg)}: buffer is {name} but count is {count}; "
                         f"{name} only makes an empty message")
    if displ is not None and as_count(displ, arg, "displacement") > 0:
        raise ValueError(f"{argstr(arg)}: displacement {displ} is past the end of "
                         f"an empty message ({name})")
    x.count = 0
    x.explicit = count is not None
    return 0


cdef tuple pair(object item, const char *arg):
    if len(item) != 2:
        raise ValueError(f"{argstr(arg)}: expected a (count, displacement) pair, "
                         f"got {len(item)} items")
    return item[0], item[1]


cdef inline bint is_scalar_int(object x):
    # ints, numpy integers, 0-d integer arrays/tensors (1-D ones have __index__ too);
    # lists first: a failing hasattr costs an exception
    if type(x) is list or type(x) is tuple or x is None:
        return False
    return isinstance(x, int) or (hasattr(x, "__index__") and getattr(x, "ndim", 0) == 0)


cdef list int_list(object values, const char *arg, str what):
    if type(values) is list:
        return <list>values
    if type(values) is tuple:
        return list(values)
    if hasattr(values, "tolist") and hasattr(values, "dtype"):    # tensor, ndarray
        if getattr(values, "ndim", 1) == 0:          # a scalar that is no integer
            raise TypeError(f"{argstr(arg)}: {what} must be an integer or a sequence "
                            f"of ints, got {type(values).__name__} of dtype {values.dtype}")
        if getattr(values, "ndim", 1) != 1:
            raise ValueError(f"{argstr(arg)}: {what} must be 1-D, got shape "
                             f"{tuple(values.shape)}")
        kind = str(values.dtype)
        if "int" not in kind:
            raise TypeError(f"{argstr(arg)}: {what} must hold integers, got dtype {kind}")
        values = values.tolist()
    try:
        return list(values)
    except TypeError:
        raise TypeError(f"{argstr(arg)}: {what} must be a sequence of ints, got "
                        f"{type(values).__name__}") from None


cdef int fill_ints(object values, int *out, int size, const char *arg, str what,
                   bint neighbours=False) except -1:
    """Entries of a counts or displs sequence into `out` (`size` of them: one
    per process, or per neighbour of a topology)."""
    cdef list items = int_list(values, arg, what)
    cdef Py_ssize_t i, n = len(items)
    if n != size:
        raise ValueError(f"{argstr(arg)}: {what} has {n} entries, expected "
                         f"{size} (one per {'neighbour' if neighbours else 'process'})")
    for i in range(n):
        out[i] = item_count(items[i], arg, what, i)
    return 0


cdef object parse_vector(object spec, side *x, bint writable, int size, const char *arg,
                         int *room, bint neighbours=False):
    """Parse a message with one block per process: buf | [buf, counts] |
    [buf, (counts, displs)] | [buf, counts, displs] | [buf, counts, datatype] |
    [buf, (counts, displs), datatype] | [buf, counts, displs, datatype].
    Up to SMALL_BLOCKS processes, the counts and displacements go into `room`
    (2 * SMALL_BLOCKS ints of the caller's message: no object to make per
    call); return the object keeping the buffer alive, and for more processes
    (owner, counts, displs), which keeps the arrays alive too. `neighbours`:
    the blocks are a topology's, one per neighbour (in messages)."""
    cdef bufinfo b
    buf, counts, displs, datatype = spec, None, None, None
    cdef Py_ssize_t n
    if isinstance(spec, (list, tuple)):
        n = len(spec)
        if not 1 <= n <= 4:
            raise ValueError(f"{argstr(arg)}: message must have 1 to 4 items, got {n}")
        buf = spec[0]
        if n == 4:
            counts, displs, datatype = spec[1], spec[2], spec[3]
        elif n == 3 and not (spec[2] is None or is_datatype(spec[2])):
            counts, displs = spec[1], spec[2]          # mcr's [buf, counts, displs]
        elif n >= 2:
            second = spec[1]
            if n == 3:
                datatype = spec[2]
            if isinstance(second, tuple) and len(second) == 2:
                counts, displs = second                # mpi4py: a pair is (counts, displs)
            elif n == 2 and is_datatype(second):
                datatype = second
            else:
                counts = second
    if buf is IN_PLACE:
        reject_in_place(arg)
    cdef bint empty = buf is None or buf is BOTTOM
    if empty:
        empty_message(x, buf, None, None, datatype, arg)
        owner = None
    else:
        owner = as_buffer(buf, &b, writable, datatype is not None, arg)
        set_buffer(x, &b, datatype, arg)
    cdef _Ints cs = None, ds = None
    cdef int *cd
    cdef int *dd
    if size <= SMALL_BLOCKS:
        cd, dd = room, room + SMALL_BLOCKS
    else:
        cs, ds = new_ints(size), new_ints(size)
        cd, dd = cs.data, ds.data
    cdef Py_ssize_t i, total = 0
    if counts is None:
        # as mpi4py: the buffer split into `size` blocks, the first ones one
        # element longer when it does not split evenly
        if not empty:
            infer_count(x, b.nbytes, arg)
        for i in range(size):
            cd[i] = <int>(x.count // size + (i < x.count % size))
    elif is_scalar_int(counts):
        each = as_count(counts, arg, "count")
        for i in range(size):
            cd[i] = each
    else:
        fill_ints(counts, cd, size, arg, "counts", neighbours)
    if displs is None:
        for i in range(size):
            if total > INT_MAX:
                raise OverflowError(f"{argstr(arg)}: displacement {total} exceeds the "
                                    f"MPI limit {INT_MAX}")
            dd[i] = <int>total
            total += cd[i]
    elif not is_scalar_int(displs):
        fill_ints(displs, dd, size, arg, "displs", neighbours)
    else:                                              # mpi4py: a stride
        stride = as_count(displs, arg, "displacement stride")
        for i in range(size):
            if stride * i > INT_MAX:
                raise OverflowError(f"{argstr(arg)}: displacement {stride * i} exceeds the "
                                    f"MPI limit {INT_MAX}")
            dd[i] = <int>(stride * i)
    for i in range(size):
        if cd[i] and <Py_ssize_t>dd[i] + cd[i] > x.nelems:
            if empty:
                raise ValueError(f"{argstr(arg)}: buffer is {'None' if buf is None else 'BOTTOM'}"
                                 f" but counts[{i}] is {cd[i]}; it only makes an empty "
                                 "message")
            raise ValueError(f"{argstr(arg)}: block {i} (count {cd[i]} at displacement "
                             f"{dd[i]}) reaches past the buffer of {x.nelems} elements")
    x.counts = cd
    x.displs = dd
    x.nblocks = size
    if cs is None:
        return owner
    return (owner, cs, ds)


cdef int check_blocks_disjoint(side *x, int size, const char *arg) except -1:
    """MPI forbids receiving into one location twice: the blocks of a vector
    receive must not overlap."""
    cdef int i
    cdef Py_ssize_t end = 0
    for i in range(size):             # blocks in increasing order: one pass
        if x.counts[i] == 0:
            continue
        if x.displs[i] < end:
            return check_unordered_blocks(x, size, arg)
        end = <Py_ssize_t>x.displs[i] + x.counts[i]
    return 0


cdef int check_unordered_blocks(side *x, int size, const char *arg) except -1:
    """check_blocks_disjoint for blocks out of order (apart, so that the
    common case makes no generator)."""
    cdef int i, j
    blocks = sorted((x.displs[i], i) for i in range(size) if x.counts[i])
    for k in range(1, len(blocks)):
        i, j = blocks[k - 1][1], blocks[k][1]
        if <Py_ssize_t>x.displs[i] + x.counts[i] > x.displs[j]:
            a_end = <Py_ssize_t>x.displs[i] + x.counts[i] - 1
            b_end = <Py_ssize_t>x.displs[j] + x.counts[j] - 1
            raise ValueError(f"{argstr(arg)}: blocks {i} (elements {x.displs[i]}..{a_end}) "
                             f"and {j} (elements {x.displs[j]}..{b_end}) overlap; MPI "
                             "forbids receiving into one location twice")
    return 0


cdef int set_in_place(side *x, side *other) noexcept:
    # MPI ignores the in-place side's count and type, but some implementations
    # (Open MPI's non-blocking alltoall) still read the type: give it the other's
    x.addr = <char*>MPI_IN_PLACE
    x.device = -1
    x.counts = x.displs = NULL
    x.count = 0
    x.nelems = 0
    x.explicit = False
    x.dtype = other.dtype
    x.tindex = other.tindex
    x.extent = other.extent
    return 0


cdef int set_null(side *x) noexcept:
    x.addr = NULL
    x.device = -1
    x.counts = x.displs = NULL
    x.count = 0
    x.nelems = 0
    x.explicit = False
    x.dtype = MPI_BYTE
    x.tindex = -1
    x.extent = 1
    return 0


cdef inline bint in_place(object sendbuf):
    # mpi4py reads None as IN_PLACE where IN_PLACE is allowed
    return sendbuf is IN_PLACE or sendbuf is None


cdef int no_null_recvbuf(object recvbuf, side *s) except -1:
    """A reduction's recvbuf given as None: say so, rather than report the
    empty message's element size or count."""
    if recvbuf is None:
        raise TypeError(f"recvbuf: None is not a buffer; the reduction needs room for "
                        f"{s.count} elements" + ("" if s.tindex < 0 else
                                                 f" of {TYPE_NAMES[s.tindex]}"))
    return 0


cdef inline str type_name(side *x):
    return TYPE_NAMES[x.tindex] if x.tindex >= 0 else "MPI datatype"


class TypeMismatchError(TypeError, ValueError):
    """Send and receive element types that do not match: a TypeError, and a
    ValueError as mpi4py raises, so that code written for either catches it."""


class UnknownTypecodeError(ValueError, KeyError):
    """A typecode string that names no type: a ValueError, and a KeyError as
    mpi4py raises."""

    __str__ = ValueError.__str__          # not KeyError's repr of the message


cdef int check_same_type(side *s, side *r) except -1:
    """The reductions' rule: one element type on both sides (MPI takes one
    datatype); of a derived datatype mcr knows only the extent."""
    if s.tindex >= 0 and r.tindex >= 0:
        if s.tindex != r.tindex:
            raise TypeMismatchError(f"sendbuf has {TYPE_NAMES[s.tindex]} elements but "
                                    f"recvbuf has {TYPE_NAMES[r.tindex]}: the element "
                                    "types must match")
    elif s.extent != r.extent:
        raise TypeMismatchError(f"sendbuf elements are {s.extent} bytes but recvbuf "
                                f"elements are {r.extent} bytes: the datatypes must match")
    return 0


cdef Py_ssize_t type_size(side *x) except -1:
    """Bytes of data in one element of a side: MPI_Type_size, which for a
    derived datatype is less than its extent when it has holes."""
    cdef int tsize = 0
    if x.tindex >= 0:
        return x.extent
    CHKERR(MPI_Type_size(x.dtype, &tsize))
    return tsize


cdef bint same_signature(side *s, Py_ssize_t scount, side *r, Py_ssize_t rcount) except -1:
    """Whether `scount` elements of `s` and `rcount` of `r` have the same
    type signature, which is MPI's rule for the data moved between two
    processes, whatever their datatypes (a column type sends 3 DOUBLEs as 1
    element). mcr knows the element types of named datatypes: different ones
    raise, the same ones compare the counts. Of a derived datatype (or BYTE)
    it knows only the signature's length: count x type size."""
    if s.tindex >= 0 and r.tindex >= 0:
        check_same_type(s, r)
        return scount == rcount
    return scount * type_size(s) == rcount * type_size(r)


cdef str signature_bytes(side *s, Py_ssize_t scount, side *r, Py_ssize_t rcount):
    """For an error of same_signature: the bytes it compared, when it did."""
    if s.tindex >= 0 and r.tindex >= 0:
        return ""
    return (f" ({scount * type_size(s)} bytes of type signature sent, "
            f"{rcount * type_size(r)} received)")


cdef int check_disjoint(side *s, side *r) except -1:
    return check_apart(s, r, 1, 1, False, b"sendbuf")


cdef inline int check_apart(side *s, side *r, int s_blocks, int r_blocks, bint v,
                            const char *in_place) except -1:
    """MPI forbids send and receive buffers that share memory (MPICH refuses
    them, Open MPI may compute garbage): name the fix instead. A side spans
    blocks of its count, or with v its vector blocks; in_place names the
    side that takes IN_PLACE (NULL: none can; "Sendrecv_replace": the method
    that sends a buffer and receives into it). Sides of derived datatypes,
    whose elements may interleave without touching, are MPI's to judge."""
    if s.addr + s.nelems * s.extent <= r.addr or r.addr + r.nelems * r.extent <= s.addr:
        return 0                          # the whole buffers apart: the common case
    return check_spans_apart(s, r, s_blocks, r_blocks, v, in_place)


cdef int check_spans_apart(side *s, side *r, int s_blocks, int r_blocks, bint v,
                           const char *in_place) except -1:
    if s.tindex < 0 or r.tindex < 0:
        return 0
    cdef char *s_end = s.addr + blocks_end(s, s_blocks, v) * s.extent
    cdef char *r_end = r.addr + blocks_end(r, r_blocks, v) * r.extent
    if s.addr < r_end and r.addr < s_end and s_end > s.addr and r_end > r.addr:
        off = r.addr - s.addr
        where = (f"sendbuf and recvbuf overlap in memory (sendbuf's {s_end - s.addr} bytes, "
                 f"recvbuf's {r_end - r.addr}, recvbuf starting {abs(off)} bytes "
                 f"{'after' if off >= 0 else 'before'} sendbuf)")
        if in_place == NULL:
            raise ValueError(f"{where}, which MPI forbids")
        if argstr(in_place) == "Sendrecv_replace":
            raise ValueError(f"{where}, which MPI forbids; Sendrecv_replace sends a buffer "
                             "and receives into it")
        raise ValueError(f"{where}; for an in-place operation pass IN_PLACE as "
                         f"{argstr(in_place)}")
    return 0


cdef Py_ssize_t blocks_end(side *x, int blocks, bint v) noexcept:
    """Elements from a side's address to the end of what it moves: blocks of
    x.count elements, or (v) the end of its last vector block."""
    cdef Py_ssize_t end = 0
    cdef int i
    if not v or x.counts == NULL or x.displs == NULL:
        return <Py_ssize_t>x.count * blocks
    for i in range(x.nblocks):
        if x.counts[i] and <Py_ssize_t>x.displs[i] + x.counts[i] > end:
            end = <Py_ssize_t>x.displs[i] + x.counts[i]
    return end


cdef int as_rank(object value, int size, const char *arg, bint allow_null) except? -1:
    """A rank argument as a C int, checked against the communicator size."""
    cdef int rank
    try:
        rank = value
    except OverflowError:
        rank = -1000            # out of range whatever the size
    except TypeError:
        raise TypeError(f"{argstr(arg)}: expected an integer rank, got "
                        f"{type(value).__name__}") from None
    if 0 <= rank < size or (allow_null and rank == MPI_PROC_NULL):
        return rank
    raise IndexError(f"{argstr(arg)}: rank {value} is out of range for a communicator "
                     f"of size {size} (valid: 0..{size - 1})")


cdef int check_capacity(side *x, Py_ssize_t needed, const char *arg, str why) except -1:
    if x.nelems < needed:
        raise ValueError(f"{argstr(arg)}: buffer holds {x.nelems} elements, {why} needs "
                         f"{needed}")
    return 0


cdef int per_process(side *x, int size, const char *arg) except -1:
    # As in mpi4py: an explicit count is per process; otherwise the buffer
    # holds one equal block per process.
    if x.explicit:
        check_capacity(x, <Py_ssize_t>x.count * size, arg,
                       f"{x.count} elements per process x {size} processes")
    elif x.count % size:
        raise ValueError(f"{argstr(arg)}: {x.count} elements do not split evenly among "
                         f"{size} processes")
    else:
        x.count //= size
    return 0


@cython.freelist(16)
@cython.no_gc          # holds the caller's arguments and buffers; created on every call
cdef class _Call:
    """One call of a buffer method, as one value: its operation (an index into
    the descriptor table OP_TABLE, ops.pxi), form and backend, its arguments by
    name, and once parsed, its send and receive sides and what keeps them
    alive. A neighbourhood collective's message is one too (op CALL_COUNT +
    its kind), with only the sides."""
    cdef int op, form
    cdef object backend      # as the caller named it (None: the communicator's default)
    cdef object compress     # the call's compress argument (None: the default, False: none)
    cdef object info         # a persistent collective's info, or None
    # the arguments (those the operation has; the others None). `buf` is
    # sendbuf in Send, recvbuf in Recv, Bcast and Sendrecv_replace; `tag` is
    # Sendrecv's sendtag
    cdef object sendbuf, recvbuf, dest, source, tag, recvtag, status, root, redop
    cdef object recvcounts
    cdef bint parsed         # the sides below are set (parse runs once per call)
    cdef int idest, isource, itag, irecvtag, iroot
    cdef MPI_Op mop
    cdef int sblocks, rblocks    # blocks of each side's count the operation moves (staging)
    cdef object w            # Alltoallw: its _MsgW (per-process datatypes), else None
    # on the interceptor chain (chain.pxi): the chain, the backend's Subcomm
    # (None: MPI; AUTO_SUB until auto chose) and name, what made auto choose
    # it, and the logger's record (compression reports the bytes it sends)
    cdef tuple chain
    cdef object sub
    cdef str name
    cdef object why
    cdef object rec
    # a call outside the buffer methods (op COMM_OP, COMM_P2P_OP): a
    # constructor, or one of mpi4py's methods on pickled objects: its kind
    # (COMM_MADE, ...), name ("Dup", "bcast"), mpi4py's function and its
    # arguments; `inner`: made by a call already on the chain (a
    # neighbourhood collective's, which the interceptors have seen)
    cdef int kind, p2p
    cdef str callname
    cdef object make
    cdef tuple makeargs
    cdef bint inner
    cdef side s, r
    cdef object sown, rown
    cdef int sroom[2 * SMALL_BLOCKS]    # counts and displacements of small vector messages
    cdef int rroom[2 * SMALL_BLOCKS]
    cdef object staged       # device buffers staged through host memory (staging.pxi)
    cdef bint live           # staged and started: the result is still to copy back
    cdef object parts        # a composed Isendrecv's _Work, for its Request (isendrecv.pxi)
    cdef object scratch      # a copy of the input MPI reads until the call completes (ops.pxi)

    cdef void forget(self):
        """Let go of everything a call set (the object is then as new; see
        recycle): only the fields that are not None are written, so a small
        call pays no reference counting on those it never set."""
        if self.backend is not None: self.backend = None
        if self.compress is not None: self.compress = None
        if self.info is not None: self.info = None
        if self.sendbuf is not None: self.sendbuf = None
        if self.recvbuf is not None: self.recvbuf = None
        if self.dest is not None: self.dest = None
        if self.source is not None: self.source = None
        if self.tag is not None: self.tag = None
        if self.recvtag is not None: self.recvtag = None
        if self.status is not None: self.status = None
        if self.root is not None: self.root = None
        if self.redop is not None: self.redop = None
        if self.recvcounts is not None: self.recvcounts = None
        if self.w is not None: self.w = None
        if self.chain is not None: self.chain = None
        if self.sub is not None: self.sub = None
        if self.name is not None: self.name = None
        if self.why is not None: self.why = None
        if self.rec is not None: self.rec = None
        if self.callname is not None: self.callname = None
        if self.make is not None: self.make = None
        if self.makeargs is not None: self.makeargs = None
        if self.sown is not None: self.sown = None
        if self.rown is not None: self.rown = None
        if self.staged is not None: self.staged = None
        if self.parts is not None: self.parts = None
        if self.scratch is not None: self.scratch = None
        self.parsed = self.inner = self.live = False
        self.kind = self.p2p = self.sblocks = self.rblocks = 0
        self.idest = self.isource = self.itag = self.irecvtag = self.iroot = 0
        memset(&self.s, 0, sizeof(side))
        memset(&self.r, 0, sizeof(side))

    cdef object arg(self, int a):
        """The argument `a` (A_SENDBUF, ...)."""
        if a == A_SENDBUF:
            return self.sendbuf
        if a == A_RECVBUF:
            return self.recvbuf
        if a == A_DEST:
            return self.dest
        if a == A_SOURCE:
            return self.source
        if a == A_TAG:
            return self.tag
        if a == A_RECVTAG:
            return self.recvtag
        if a == A_STATUS:
            return self.status
        if a == A_ROOT:
            return self.root
        if a == A_OP:
            return self.redop
        return self.recvcounts

    cdef tuple args(self):
        """The arguments in the order of the blocking method's signature (for
        the call hooks and mcr.compress)."""
        cdef OpDesc *d = &OP_TABLE[self.op]
        return tuple([self.arg(d.args[i]) for i in range(d.nargs)])

    cdef _Call again(self, int form, object backend):
        """A new call of the same operation and arguments (each start of an
        emulated persistent request), unparsed."""
        cdef _Call c = _Call.__new__(_Call)
        c.op, c.form, c.backend, c.compress = self.op, form, backend, self.compress
        c.sendbuf, c.recvbuf, c.dest, c.source = self.sendbuf, self.recvbuf, self.dest, self.source
        c.tag, c.recvtag, c.root, c.redop = self.tag, self.recvtag, self.root, self.redop
        c.recvcounts, c.why = self.recvcounts, self.why    # (auto's reason, for the logger)
        c.status = None if form != BLOCKING else self.status
        return c

    def side(self, int which):
        """Side 0 (send) or 1 (receive) for the Python backends: (kind, address,
        count, counts, displs, nelems, element type name, extent, device, owner),
        kind being "buf", "in_place" or "null"."""
        return describe_side(&self.s if which == 0 else &self.r,
                             self.sown if which == 0 else self.rown)

    # -- simple messages -------------------------------------------------

    cdef int for_allreduce(self, object sendbuf, object recvbuf) except -1:
        # Allreduce, Scan, Exscan: same count on both sides
        self.rown = parse_simple(recvbuf, &self.r, True, b"recvbuf")
        if sendbuf is IN_PLACE or sendbuf is None:
            if recvbuf is None:           # (IN_PLACE was refused by parse_simple)
                raise TypeError(f"recvbuf: None is not a buffer; with sendbuf "
                                f"{'None (IN_PLACE)' if sendbuf is None else 'IN_PLACE'} it "
                                "holds the operand and receives the result")
            set_in_place(&self.s, &self.r)
            return 0
        self.sown = parse_simple(sendbuf, &self.s, False, b"sendbuf")
        if self.s.tindex != self.r.tindex or self.s.tindex < 0 or self.s.count != self.r.count:
            self.mismatch(recvbuf)
        check_disjoint(&self.s, &self.r)
        return 0

    cdef int mismatch(self, object recvbuf) except -1:
        # the slow path of for_allreduce: name what differs
        no_null_recvbuf(recvbuf, &self.s)
        check_same_type(&self.s, &self.r)
        if self.s.count != self.r.count:
            raise ValueError(f"sendbuf has {self.s.count} elements but recvbuf has "
                             f"{self.r.count}: the counts must match")
        return 0

    cdef int for_reduce(self, object sendbuf, object recvbuf, int root, int rank,
                        int size) except -1:
        if rank != root:
            if sendbuf is IN_PLACE:
                raise ValueError(f"sendbuf: IN_PLACE is only valid at the root ({root}), "
                                 f"this is rank {rank}")
            self.sown = parse_simple(sendbuf, &self.s, False, b"sendbuf")
            set_null(&self.r)
            return 0
        return self.for_allreduce(sendbuf, recvbuf)

    cdef int for_bcast(self, object buf, int root, int rank, int size) except -1:
        self.rown = parse_simple(buf, &self.r, rank != root, b"buf")
        return 0

    cdef int for_gather(self, object sendbuf, object recvbuf, int root, int rank,
                        int size, bint v) except -1:
        if rank == root:
            if recvbuf is None:
                raise TypeError(f"recvbuf: None at the root (rank {root}), which receives "
                                f"a block from each of the {size} processes")
            self.rown = self.recv_blocks(recvbuf, size, v)
        else:
            set_null(&self.r)
        if sendbuf is IN_PLACE or (sendbuf is None and rank == root):
            if rank != root:
                raise ValueError(f"sendbuf: IN_PLACE is only valid at the root ({root}), "
                                 f"this is rank {rank}")
            set_in_place(&self.s, &self.r)
            return 0
        self.sown = parse_simple(sendbuf, &self.s, False, b"sendbuf")
        if rank == root:
            self.match_own_block(rank, v, b"sendbuf")
            check_apart(&self.s, &self.r, 1, size, v, b"sendbuf")
        return 0

    cdef int for_scatter(self, object sendbuf, object recvbuf, int root, int rank,
                         int size, bint v) except -1:
        if rank == root:
            if sendbuf is None:
                raise TypeError(f"sendbuf: None at the root (rank {root}), which sends a "
                                f"block to each of the {size} processes")
            self.sown = self.send_blocks(sendbuf, size, v)
        else:
            set_null(&self.s)
        if recvbuf is IN_PLACE or (recvbuf is None and rank == root):
            if rank != root:
                raise ValueError(f"recvbuf: IN_PLACE is only valid at the root ({root}), "
                                 f"this is rank {rank}")
            set_in_place(&self.r, &self.s)
            return 0
        self.rown = parse_simple(recvbuf, &self.r, True, b"recvbuf")
        cdef int count
        if rank == root:
            count = self.s.counts[rank] if v else self.s.count
            if not same_signature(&self.s, count, &self.r, self.r.count):
                raise ValueError(f"recvbuf: holds {self.r.count} elements but the root "
                                 f"sends itself {count}"
                                 + signature_bytes(&self.s, count, &self.r, self.r.count))
            check_apart(&self.s, &self.r, size, 1, v, b"recvbuf")
        return 0

    cdef int for_allgather(self, object sendbuf, object recvbuf, int rank, int size,
                           bint v) except -1:
        self.rown = self.recv_blocks(recvbuf, size, v)
        if in_place(sendbuf):
            set_in_place(&self.s, &self.r)
            return 0
        self.sown = parse_simple(sendbuf, &self.s, False, b"sendbuf")
        self.match_own_block(rank, v, b"sendbuf")
        check_apart(&self.s, &self.r, 1, size, v, b"sendbuf")
        return 0

    cdef int for_alltoall(self, object sendbuf, object recvbuf, int size, bint v) except -1:
        self.rown = self.recv_blocks(recvbuf, size, v)
        if in_place(sendbuf):
            set_in_place(&self.s, &self.r)
            return 0
        self.sown = self.send_blocks(sendbuf, size, v)
        # (Alltoallv: the element types only; MPI compares each pair's blocks)
        if not same_signature(&self.s, 0 if v else self.s.count, &self.r,
                              0 if v else self.r.count):
            raise ValueError(f"sendbuf sends {self.s.count} elements to each process but "
                             f"recvbuf takes {self.r.count} from each"
                             + signature_bytes(&self.s, self.s.count, &self.r, self.r.count))
        check_apart(&self.s, &self.r, size, size, v, b"sendbuf")
        return 0

    cdef int for_reduce_scatter_block(self, object sendbuf, object recvbuf,
                                      int size) except -1:
        if in_place(sendbuf):
            # the input is the whole of recvbuf, one block per process; the
            # result is its first block
            self.rown = parse_simple(recvbuf, &self.r, True, b"recvbuf")
            per_process(&self.r, size, b"recvbuf")
            set_in_place(&self.s, &self.r)
            return 0
        self.rown = parse_simple(recvbuf, &self.r, True, b"recvbuf")
        self.sown = parse_simple(sendbuf, &self.s, False, b"sendbuf")
        check_same_type(&self.s, &self.r)
        if self.s.count != <Py_ssize_t>self.r.count * size:
            raise ValueError(f"sendbuf has {self.s.count} elements, expected recvbuf count "
                             f"{self.r.count} x {size} processes = {self.r.count * size}")
        check_disjoint(&self.s, &self.r)
        return 0

    cdef int for_reduce_scatter(self, object sendbuf, object recvbuf, object recvcounts,
                                int rank, int size, MPI_Comm comm) except -1:
        cdef Py_ssize_t total = 0
        cdef int i
        cdef side *whole
        cdef bint inplace = in_place(sendbuf)
        cdef _Ints c = None               # the counts, for more than SMALL_BLOCKS processes
        cdef int *cd = self.rroom
        if size > SMALL_BLOCKS:
            c = new_ints(size)
            cd = c.data
        if recvcounts is None and not inplace:
            # as mpi4py: each process receives what its recvbuf holds; gather those
            # counts (every process, so that none waits in the reduction alone)
            return self.reduce_scatter_gathered(sendbuf, recvbuf, c, cd, rank, size, comm)
        if inplace:
            self.rown = parse_simple(recvbuf, &self.r, True, b"recvbuf")
            set_in_place(&self.s, &self.r)
            whole = &self.r
        else:
            self.sown = parse_simple(sendbuf, &self.s, False, b"sendbuf")
            self.rown = parse_simple(recvbuf, &self.r, True, b"recvbuf")
            check_same_type(&self.s, &self.r)
            check_disjoint(&self.s, &self.r)
            whole = &self.s
        if recvcounts is None:
            if whole.count % size:
                raise ValueError(f"recvbuf: cannot split {whole.count} elements evenly "
                                 f"among {size} processes; give recvcounts")
            recvcounts = [whole.count // size] * size
        values = int_list(recvcounts, b"recvcounts", "recvcounts")
        if len(values) != size:
            raise ValueError(f"recvcounts: has {len(values)} entries, expected {size} "
                             "(one per process)")
        for i in range(size):
            cd[i] = item_count(values[i], b"recvcounts", "recvcounts", i)
            total += cd[i]
        if whole.count != total:
            raise ValueError(f"{'recvbuf' if inplace else 'sendbuf'}: has "
                             f"{whole.count} elements, sum(recvcounts) is {total}")
        if not inplace and self.r.count < cd[rank]:
            # the message's count, given or inferred, as mpi4py checks it
            raise ValueError(f"recvbuf: holds {self.r.count} elements, "
                             f"recvcounts[{rank}] needs {cd[rank]}")
        self.r.counts = cd
        self.r.nblocks = size
        if c is not None:
            self.rown = (self.rown, c)
        return 0

    cdef int reduce_scatter_gathered(self, object sendbuf, object recvbuf, _Ints c,
                                     int *cd, int rank, int size, MPI_Comm comm) except -1:
        """Reduce_scatter without recvcounts: gather every process's (receive,
        send) counts, so that all of them refuse the call together when one
        process's arguments are wrong, instead of the others hanging."""
        cdef _Ints pairs = new_ints(2 * size)
        cdef int mine[2]
        cdef Py_ssize_t total = 0
        cdef int i, ierr
        failure = None
        try:
            self.sown = parse_simple(sendbuf, &self.s, False, b"sendbuf")
            self.rown = parse_simple(recvbuf, &self.r, True, b"recvbuf")
            check_same_type(&self.s, &self.r)
            check_disjoint(&self.s, &self.r)
            mine[0], mine[1] = self.r.count, self.s.count
        except BaseException as exc:    # in this module, `Exception` is mcr.Exception
            failure = exc
            mine[0] = mine[1] = -1
        with nogil:
            ierr = MPI_Allgather(mine, 2, MPI_INT, pairs.data, 2, MPI_INT, comm)
        CHKERR(ierr)
        if failure is not None:
            raise failure
        for i in range(size):
            if pairs.data[2 * i] < 0:
                raise ValueError(f"sendbuf, recvbuf: refused at rank {i}, so the "
                                 "reduction cannot run (see the error there)")
            cd[i] = pairs.data[2 * i]
            total += cd[i]
        for i in range(size):
            if pairs.data[2 * i + 1] != total:
                raise ValueError(f"sendbuf: has {pairs.data[2 * i + 1]} elements at rank "
                                 f"{i}, but the receive counts (the recvbuf sizes) sum to "
                                 f"{total}")
        self.r.counts = cd
        self.r.nblocks = size
        if c is not None:
            self.rown = (self.rown, c)
        return 0

    # -- helpers for block messages ---------------------------------------

    cdef object recv_blocks(self, object recvbuf, int size, bint v):
        if recvbuf is None:       # (say so, rather than report the empty message's sizes)
            raise TypeError(f"recvbuf: None is not a buffer; it receives a block from each "
                            f"of the {size} processes")
        if v:
            owner = parse_vector(recvbuf, &self.r, True, size, b"recvbuf", self.rroom)
            check_blocks_disjoint(&self.r, size, b"recvbuf")
            return owner
        owner = parse_simple(recvbuf, &self.r, True, b"recvbuf")
        per_process(&self.r, size, b"recvbuf")
        return owner

    cdef object send_blocks(self, object sendbuf, int size, bint v):
        if v:
            return parse_vector(sendbuf, &self.s, False, size, b"sendbuf", self.sroom)
        owner = parse_simple(sendbuf, &self.s, False, b"sendbuf")
        per_process(&self.s, size, b"sendbuf")
        return owner

    cdef int match_own_block(self, int rank, bint v, const char *arg) except -1:
        cdef int count = self.r.counts[rank] if v else self.r.count
        if not same_signature(&self.s, self.s.count, &self.r, count):
            raise ValueError(f"{argstr(arg)}: has {self.s.count} elements but recvbuf "
                             f"takes {count} from this process (rank {rank})"
                             + signature_bytes(&self.s, self.s.count, &self.r, count))
        return 0


# -- Alltoallw: a datatype per process ---------------------------------------------



cdef class _Types:
    """A C array of MPI datatypes (one per process) owned by a message."""
    cdef MPI_Datatype *data
    cdef object objects      # the Datatype objects: their handles stay valid

    def __dealloc__(self):
        PyMem_Free(self.data)


cdef object parse_vector_w(object spec, char **addr, int **counts, int **displs,
                           MPI_Datatype **types, bint writable, int size, const char *arg):
    """Parse [buf, datatypes] | [buf, (counts, displs), datatypes] |
    [buf, counts, displs, datatypes] (mpi4py's forms; displacements in bytes,
    one datatype per process; the 2-item form is one element of each type at
    the start of buf; buf may be BOTTOM, with counts and displs). Check each
    block against the buffer. Return the objects keeping it all alive."""
    cdef bufinfo b
    cdef side t
    cdef MPI_Aint lb = 0, extent = 0, tlb = 0, textent = 0
    cdef Py_ssize_t i, lo, hi
    if not isinstance(spec, (list, tuple)):
        raise TypeError(f"{argstr(arg)}: expected [buf, datatypes], [buf, (counts, displs), "
                        f"datatypes] or [buf, counts, displs, datatypes], got "
                        f"{type(spec).__name__}")
    n = len(spec)
    counts_in = displs_in = None
    if n == 2:
        buf, types_in = spec
    elif n == 3:
        buf, types_in = spec[0], spec[2]
        counts_in, displs_in = pair(spec[1], arg)
    elif n == 4:
        buf, counts_in, displs_in, types_in = spec
    else:
        raise ValueError(f"{argstr(arg)}: message must have 2 to 4 items, got {n}")
    cdef Py_ssize_t nbytes = -1               # BOTTOM: absolute addresses, unchecked
    if buf is BOTTOM:
        if counts_in is None or displs_in is None:
            raise ValueError(f"{argstr(arg)}: BOTTOM needs counts and displs")
        owner = None
        addr[0] = <char*>MPI_BOTTOM
    else:
        owner = as_buffer(buf, &b, writable, True, arg)     # each block has its datatype
        if b.device >= 0:
            # per-process datatypes cannot be staged block by block through host memory
            raise ValueError(f"{argstr(arg)}: Alltoallw moves host memory only, got a buffer "
                             f"on CUDA device {b.device}; use Alltoallv")
        addr[0] = b.addr
        nbytes = b.nbytes
    if not isinstance(types_in, (list, tuple)):
        raise TypeError(f"{argstr(arg)}: datatypes must be a list of one MPI.Datatype per "
                        f"process, got {type(types_in).__name__}")
    tlist = list(types_in)
    if len(tlist) != size:
        raise ValueError(f"{argstr(arg)}: datatypes has {len(tlist)} entries, expected "
                         f"{size} (one per process)")
    cdef _Types ts = _Types.__new__(_Types)
    ts.data = <MPI_Datatype*>PyMem_Malloc(max(size, 1) * sizeof(MPI_Datatype))
    if ts.data == NULL:
        raise MemoryError
    ts.objects = tlist
    for i in range(size):
        if not is_datatype(tlist[i]):
            raise TypeError(f"{argstr(arg)}: datatypes[{i}] must be an MPI.Datatype or a "
                            f"typecode string, got {type(tlist[i]).__name__}")
        set_datatype(&t, tlist[i], arg)
        ts.data[i] = t.dtype
    cdef _Ints c = new_ints(size)
    cdef _Ints d = new_ints(size)
    if counts_in is None:
        for i in range(size):
            c.data[i] = 1
            d.data[i] = 0
    else:
        for values, a, what in ((int_list(counts_in, arg, "counts"), c, "counts"),
                                (int_list(displs_in, arg, "displs"), d, "displs")):
            if len(values) != size:
                raise ValueError(f"{argstr(arg)}: {what} has {len(values)} entries, "
                                 f"expected {size} (one per process)")
            for i in range(size):
                (<_Ints>a).data[i] = item_count(values[i], arg, what, i)
    for i in range(size):
        if nbytes < 0 or c.data[i] == 0:
            continue
        CHKERR(MPI_Type_get_extent(ts.data[i], &lb, &extent))
        CHKERR(MPI_Type_get_true_extent(ts.data[i], &tlb, &textent))
        lo = d.data[i] + tlb
        hi = d.data[i] + tlb + textent + <Py_ssize_t>(c.data[i] - 1) * extent
        if lo < 0 or hi > nbytes:
            raise ValueError(f"{argstr(arg)}: block {i} ({c.data[i]} elements of "
                             f"{textent} bytes at byte displacement {d.data[i]}) spans bytes "
                             f"{lo}..{hi}, past the buffer of {nbytes} bytes")
    counts[0] = c.data
    displs[0] = d.data
    types[0] = ts.data
    return (owner, c, d, ts)


# One _Call kept for the next call: a blocking call that nobody else holds
# when it returns (no Request, record or interceptor kept it) gives its
# object back (recycle), cleared; the next call takes it (new_call) instead
# of allocating one and setting all its fields to None.
cdef _Call spare_call = None


cdef inline _Call new_call():
    global spare_call
    cdef _Call c = spare_call
    if c is None:
        return _Call.__new__(_Call)
    spare_call = None
    return c


cdef inline void recycle(_Call c):
    """Keep `c` for the next call if only its caller's reference is left
    (the buffer method's own, as it returns)."""
    global spare_call
    if spare_call is None and Py_REFCNT(c) == 1:
        c.forget()
        spare_call = c


cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MIN


cdef int w_block(char *addr, int count, int displ, MPI_Datatype t, Py_ssize_t *lo,
                 Py_ssize_t *hi) except -1:
    """The bytes [lo, hi) that an Alltoallw block covers: 1 when it is one
    run of bytes, 0 when empty, 2 when its datatype has holes."""
    cdef int tsize = 0
    cdef MPI_Aint lb = 0, extent = 0, tlb = 0, textent = 0
    if count == 0:
        return 0
    CHKERR(MPI_Type_size(t, &tsize))
    if tsize == 0:
        return 0
    CHKERR(MPI_Type_get_extent(t, &lb, &extent))
    CHKERR(MPI_Type_get_true_extent(t, &tlb, &textent))
    if tsize != textent or (count > 1 and extent != textent):
        return 2
    lo[0] = <Py_ssize_t>addr + displ + tlb
    hi[0] = lo[0] + <Py_ssize_t>count * textent
    return 1


cdef bint w_span(char *addr, int *counts, int *displs, MPI_Datatype *types, int size,
                 Py_ssize_t *lo, Py_ssize_t *hi, bint *ordered) except -1:
    """The bytes [lo, hi) from the first to the end of the last of a side's
    blocks (False: one has holes); `ordered` (if not NULL) is cleared unless
    the blocks come one after another, apart."""
    cdef int i, got
    cdef Py_ssize_t b_lo = 0, b_hi = 0, end = PY_SSIZE_T_MIN
    lo[0], hi[0] = PY_SSIZE_T_MAX, PY_SSIZE_T_MIN
    for i in range(size):
        got = w_block(addr, counts[i], displs[i], types[i], &b_lo, &b_hi)
        if got == 2:
            return False
        if got:
            if ordered != NULL and b_lo < end:
                ordered[0] = False
            end = b_hi
            lo[0], hi[0] = min(lo[0], b_lo), max(hi[0], b_hi)
    return True


cdef list w_spans(int which, char *addr, int *counts, int *displs, MPI_Datatype *types,
                  int size):
    """The non-empty blocks of side `which` (0: send, 1: receive) as
    (start, end, side, process, offset in the buffer)."""
    cdef int i
    cdef Py_ssize_t lo = 0, hi = 0
    out = []
    for i in range(size):
        if w_block(addr, counts[i], displs[i], types[i], &lo, &hi) == 1:
            out.append((lo, hi, which, i, lo - <Py_ssize_t>addr))
    return out


cdef int w_apart_error(tuple a, tuple b) except -1:
    """Raise for Alltoallw's blocks `a` and `b` (start, end, side, process,
    offset), which overlap."""
    def where(t):
        name = "recvbuf" if t[2] else "sendbuf"
        return f"{name}'s block {t[3]} (bytes {t[4]}..{t[4] + t[1] - t[0] - 1} of {name})"
    if a[2] and b[2]:
        raise ValueError(f"recvbuf: {where(a)} and {where(b)} overlap; MPI forbids receiving "
                         "into one location twice")
    raise ValueError(f"sendbuf and recvbuf overlap in memory: {where(a)} and {where(b)}; for "
                     "an in-place operation pass IN_PLACE as sendbuf")


@cython.no_gc
cdef class _MsgW:
    """The parsed sides of an Alltoallw: per process a count, a byte
    displacement and a datatype on each side, and what keeps them alive."""
    cdef char *saddr
    cdef char *raddr
    cdef int *scounts
    cdef int *sdispls
    cdef int *rcounts
    cdef int *rdispls
    cdef MPI_Datatype *stypes
    cdef MPI_Datatype *rtypes
    cdef object sown, rown

    cdef int for_alltoallw(self, object sendbuf, object recvbuf, int size) except -1:
        self.rown = parse_vector_w(recvbuf, &self.raddr, &self.rcounts, &self.rdispls,
                                   &self.rtypes, True, size, b"recvbuf")
        if sendbuf is IN_PLACE:
            # MPI ignores the send arrays in place; hand it valid ones all the same
            self.saddr = <char*>MPI_IN_PLACE
            self.scounts, self.sdispls, self.stypes = self.rcounts, self.rdispls, self.rtypes
            return 0
        self.sown = parse_vector_w(sendbuf, &self.saddr, &self.scounts, &self.sdispls,
                                   &self.stypes, False, size, b"sendbuf")
        return self.check_apart(size)

    cdef int check_apart(self, int size) except -1:
        """MPI forbids a location that two blocks receive into, or that one
        block sends from and another receives into. Checked where every
        non-empty block is one run of bytes (a derived datatype with holes
        may interleave with another without touching: MPI's to judge). The
        common case, sides apart and receive blocks in order, takes one pass
        over each side."""
        cdef Py_ssize_t s_lo, s_hi, r_lo, r_hi
        cdef bint ordered = True
        if not w_span(self.saddr, self.scounts, self.sdispls, self.stypes, size, &s_lo, &s_hi,
                      NULL) or \
                not w_span(self.raddr, self.rcounts, self.rdispls, self.rtypes, size, &r_lo,
                           &r_hi, &ordered):
            return 0
        if ordered and (s_hi <= r_lo or r_hi <= s_lo):
            return 0
        spans = w_spans(0, self.saddr, self.scounts, self.sdispls, self.stypes, size) + \
            w_spans(1, self.raddr, self.rcounts, self.rdispls, self.rtypes, size)
        spans.sort()
        ends = [None, None]               # per side: the span reaching furthest so far
        for span in spans:
            for other in (ends[1],) if span[2] == 0 else (ends[1], ends[0]):
                if other is not None and span[0] < other[1]:
                    w_apart_error(other, span)
            if ends[span[2]] is None or span[1] > ends[span[2]][1]:
                ends[span[2]] = span
        return 0

    cdef int move_own_block(self, MPI_Comm comm) except -1:
        """Copy this process's block to itself (through MPI_Pack, so with MPI's
        type matching) and leave MPI nothing to move: Open MPI 5's
        single-process Alltoallw (coll/self) scales the byte displacements by
        the extent, reading and writing past the buffers."""
        if self.saddr == <char*>MPI_IN_PLACE:
            return 0
        cdef int nbytes = 0, position = 0
        CHKERR(MPI_Pack_size(self.scounts[0], self.stypes[0], comm, &nbytes))
        packed = bytearray(nbytes)
        cdef char *tmp = packed
        CHKERR(MPI_Pack(self.saddr + self.sdispls[0], self.scounts[0], self.stypes[0], tmp,
                        nbytes, &position, comm))
        nbytes = position
        position = 0
        CHKERR(MPI_Unpack(tmp, nbytes, &position, self.raddr + self.rdispls[0],
                          self.rcounts[0], self.rtypes[0], comm))
        if position != nbytes:
            exc = Exception(MPI_ERR_TRUNCATE)
            add_note(exc, f"recvbuf: block 0 takes {position} bytes (packed), the process "
                          f"sends itself {nbytes}")
            raise exc
        self.scounts[0] = self.rcounts[0] = 0
        return 0
