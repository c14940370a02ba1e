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


cdef inline bint needs_staging(_Msg m) noexcept:
    return m.s.device >= 0 or m.r.device >= 0 or stage_host


cdef object device_module():
    global _device_module
    if _device_module is None:
        from mcr import device
        _device_module = device
    return _device_module


cdef inline object base_owner(object owner):
    # vector messages keep (buffer owner, counts, displs)
    while type(owner) is tuple:
        owner = owner[0]
    return owner


cdef int stage(_Msg m, int mode) except -1:
    """Prepare the buffers of `m` for MPI; nothing to do when only validating."""
    if mode == VALIDATE:
        return 0
    dev = device_module()
    m.staged = []
    cdef side *x
    cdef Py_ssize_t nbytes
    for which in range(2):
        x = &m.s if which == 0 else &m.r
        if x.addr == NULL or x.addr == <char*>MPI_IN_PLACE:
            continue
        if x.device < 0 and not stage_host:
            continue
        nbytes = x.nelems * x.extent
        if nbytes == 0:
            continue
        owner = base_owner(m.sown if which == 0 else m.rown)
        interface = dev.interface(x.device)
        region = interface.region(owner, <Py_ssize_t>x.addr, nbytes)
        if interface.mpi_reads_device:
            interface.synchronize(region)     # MPI reads what the stream has written
            m.staged.append((which, region, None, interface))
            continue
        host = interface.to_host(region)
        x.addr = <char*>PyLong_AsVoidPtr(host.data_ptr())
        m.staged.append((which, region, host, interface))
    return 0


cdef int restage(_Msg m) except -1:
    """Before each start of a persistent request: refresh the host copies."""
    for which, region, host, interface in m.staged:
        if host is None:
            interface.synchronize(region)
        else:
            interface.copy(host, region)
    return 0


cdef int unstage(_Msg m) except -1:
    """After completion: copy the staged receive side back to the device."""
    for which, region, host, interface in m.staged:
        if which == 1 and host is not None:
            interface.copy(region, host)
    return 0


cdef inline int release_buffers(_MPI.Request req) except -1:
    """A request completed: copy staged results back, and let non-persistent
    requests drop their buffers."""
    buf = req.ob_buf
    if buf is not None and type(buf) is _Msg and (<_Msg>buf).staged is not None:
        unstage(<_Msg>buf)
    if req.ob_mpi == MPI_REQUEST_NULL:
        req.ob_buf = None
    return 0


cdef tuple describe_side(side *x, object owner):
    kind = "buf"
    if x.addr == <char*>MPI_IN_PLACE:
        kind = "in_place"
    elif owner is None:
        kind = "null"
    counts = displs = None
    cdef _Ints a
    if type(owner) is tuple:      # (owner, counts[, displs]) of vector messages
        a = <_Ints>owner[1]
        counts = [a.data[i] for i in range(a.n)]
        if len(owner) > 2:
            a = <_Ints>owner[2]
            displs = [a.data[i] for i in range(a.n)]
    return (kind, <Py_ssize_t>x.addr, x.count, counts, displs, x.nelems,
            TYPE_NAMES[x.tindex] if x.tindex >= 0 else None, x.extent, x.device,
            base_owner(owner))
