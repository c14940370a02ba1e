# Device buffers on the MPI backend. A CUDA buffer goes to MPI as it is when the
# library is CUDA-aware (after the caller's stream has finished writing it);
# otherwise it is staged: copied to pinned host memory before the call, and the
# receive side copied back when the operation completes (at once for blocking
# calls, in Wait/Test for requests). The copies go through the small device
# interface of mcr.device; `_set_host_staging` stages host buffers the same
# way, so that this logic is tested without a GPU.

cdef bint stage_host = False         # tests: stage host buffers too
cdef object _device_module = None


def _set_host_staging(bint on):
    """Stage host buffers through a copy, as device buffers are (for tests);
    return the previous setting."""
    global stage_host
    previous = stage_host
    stage_host = on
    return previous


cdef inline bint on_device(_Call m) noexcept:
    # a side the call does not use (the receive side of a Send) is all zeros,
    # device 0 included: only a side with an address is on a device
    return (m.s.device >= 0 and m.s.addr != NULL) or (m.r.device >= 0 and m.r.addr != NULL)


cdef inline bint needs_staging(_Call m) noexcept:
    return on_device(m) or stage_host


cdef object device_module():
    global _device_module
    if _device_module is None:
        _device_module = service("device")
    return _device_module


cdef inline object base_owner(object owner):
    # vector messages keep (buffer owner, counts, displs)
    while type(owner) is tuple:
        owner = owner[0]
    return owner


cdef list message_ranges(side *x, int blocks):
    """The (byte offset, byte count) ranges of the message from x.addr:
    `blocks` blocks of x.count elements, or the vector message's blocks."""
    cdef Py_ssize_t e = x.extent
    if x.displs != NULL:
        return [(x.displs[i] * e, x.counts[i] * e) for i in range(blocks) if x.counts[i]]
    return [(0, x.count * blocks * e)] if x.count else []


cdef int stage(_Call m, int sblocks, int rblocks) except -1:
    """Prepare the buffers of `m` for MPI; `sblocks`/`rblocks`: how many
    blocks of the side's count the operation moves (the number of processes
    for block collectives)."""
    dev = device_module()
    m.staged = []
    cdef side *x
    for which in range(2):
        x = &m.s if which == 0 else &m.r
        if x.addr == NULL or x.addr == <char*>MPI_IN_PLACE:
            continue
        if x.device < 0 and not stage_host:
            continue
        ranges = message_ranges(x, sblocks if which == 0 else rblocks)
        if not ranges:
            continue
        nbytes = max([offset + n for offset, n in ranges])
        owner = base_owner(m.sown if which == 0 else m.rown)
        interface = dev.interface(x.device)
        region = interface.region(owner, <Py_ssize_t>x.addr, nbytes)
        if interface.mpi_reads_device:
            m.staged.append((which, region, None, interface, ranges, True))
            continue
        host = interface.alloc_host(nbytes)
        x.addr = <char*>PyLong_AsVoidPtr(host.data_ptr())
        if len(ranges) == 1 and ranges[0][0] == 0:
            ranges = None         # the whole region: copied without slicing (~1 us a slice)
        m.staged.append((which, region, host, interface, ranges, not fills_receive(m, which)))
    restage(m)
    return 0


cdef inline bint fills_receive(_Call m, int which) noexcept:
    """Whether side `which` is a receive message that MPI writes in full: a
    collective's, not in place, of a named type (no holes). Its host copy then
    needs no copy in, only out (on a GPU: one blocking copy less)."""
    return (which == 1 and OP_TABLE[m.op].flags & OP_FILLS and m.r.tindex >= 0
            and m.s.addr != <char*>MPI_IN_PLACE)


cdef int copy_message(object interface, object dst, object src, object ranges) except -1:
    """Copy the message's ranges (None: the whole region) from `src` to `dst`."""
    if ranges is None:
        interface.copy(dst, src)
        return 0
    for offset, n in ranges:
        interface.copy(dst[offset:offset + n], src[offset:offset + n])
    return 0


cdef int restage(_Call m) except -1:
    """Before the operation starts (each start of a persistent request):
    MPI reads what the caller's stream has written, through the host copy."""
    for which, region, host, interface, ranges, copy_in in m.staged:
        if host is None:
            interface.synchronize(region)
        elif copy_in:
            copy_message(interface, host, region, ranges)
    m.live = True
    return 0


cdef int unstage(_Call m) except -1:
    """After completion: copy the receive side's message back, once."""
    if not m.live:
        return 0
    m.live = False
    for which, region, host, interface, ranges, _ in m.staged:
        if which == 1 and host is not None:
            copy_message(interface, region, host, ranges)
    return 0


cdef inline int release_buffers(_MPI.Request req) except -1:
    """A request completed: copy staged results back, and let non-persistent
    requests drop their buffers."""
    buf = req.ob_buf
    if buf is not None and type(buf) is _Call and (<_Call>buf).staged is not None:
        unstage(<_Call>buf)
    if req.ob_mpi == MPI_REQUEST_NULL:
        req.ob_buf = None
        if type(buf) is _Call:
            recycle(<_Call>buf)       # (kept for the next call, if nothing else holds it)
    return 0


cdef tuple describe_side(side *x, object owner):
    kind = "buf"
    if x.addr == <char*>MPI_IN_PLACE:
        kind = "in_place"
    elif owner is None:
        kind = "null"
    counts = displs = None
    if x.counts != NULL:          # a vector message
        counts = [x.counts[i] for i in range(x.nblocks)]
        if x.displs != NULL:
            displs = [x.displs[i] for i in range(x.nblocks)]
    return (kind, <Py_ssize_t>x.addr, x.count, counts, displs, x.nelems,
            TYPE_NAMES[x.tindex] if x.tindex >= 0 else None, x.extent, x.device,
            base_owner(owner))
