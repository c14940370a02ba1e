# What mcr.Fusion needs from the core on its per-call path: one look at a
# tensor (instead of five torch attribute reads), and packing and unpacking a
# bucket's host tensors with memcpy (torch.cat and split_with_sizes_copy cost
# 1-3 us per tensor, more than a 4 KiB copy).

cdef list torch_dtypes = None    # element type index -> torch.dtype (None: not torch's)


def _tensor_key(t):
    """(bytes, torch dtype, -1) of a contiguous host tensor mcr reads
    directly (the dtype and device as torch's API gives them, so that keys
    made either way are equal), or None: the caller uses torch's API."""
    global torch_dtypes
    cdef bufinfo b
    if fast_ok and type(t) is _Tensor and fast_tensor_info(t, &b) == 0:
        if torch_dtypes is None:
            torch_dtypes = [getattr(_torch, name, None) for name in TYPE_NAMES]
        return (b.nbytes, torch_dtypes[b.tindex], -1)
    return None


def _pack(list tensors, object dst):
    """Copy the host tensors `tensors` one after another into the host tensor
    `dst`; False (nothing copied) when one is not a contiguous host tensor
    the fast path reads, or they do not fit: the caller uses torch."""
    cdef bufinfo b, d
    if not fast_ok or type(dst) is not _Tensor or fast_tensor_info(dst, &d) != 0:
        return False
    cdef Py_ssize_t n = len(tensors), i, total = 0
    cdef char **addr = <char**>PyMem_Malloc(max(n, 1) * sizeof(char*))
    cdef Py_ssize_t *size = <Py_ssize_t*>PyMem_Malloc(max(n, 1) * sizeof(Py_ssize_t))
    try:
        for i in range(n):
            t = tensors[i]
            if type(t) is not _Tensor or fast_tensor_info(t, &b) != 0:
                return False
            addr[i], size[i] = b.addr, b.nbytes
            total += b.nbytes
        if total > d.nbytes:
            return False
        with nogil:
            total = 0
            for i in range(n):
                memcpy(d.addr + total, addr[i], size[i])
                total += size[i]
        return True
    finally:
        PyMem_Free(addr)
        PyMem_Free(size)


def _unpack(object src, list tensors):
    """Copy consecutive pieces of the host tensor `src` into the host tensors
    `tensors` (each its own size); False (nothing copied) as for _pack."""
    cdef bufinfo b, s
    if not fast_ok or type(src) is not _Tensor or fast_tensor_info(src, &s) != 0:
        return False
    cdef Py_ssize_t n = len(tensors), i, total = 0
    cdef char **addr = <char**>PyMem_Malloc(max(n, 1) * sizeof(char*))
    cdef Py_ssize_t *size = <Py_ssize_t*>PyMem_Malloc(max(n, 1) * sizeof(Py_ssize_t))
    try:
        for i in range(n):
            t = tensors[i]
            if type(t) is not _Tensor or fast_tensor_info(t, &b) != 0:
                return False
            addr[i], size[i] = b.addr, b.nbytes
            total += b.nbytes
        if total > s.nbytes:
            return False
        with nogil:
            total = 0
            for i in range(n):
                memcpy(addr[i], s.addr + total, size[i])
                total += size[i]
        return True
    finally:
        PyMem_Free(addr)
        PyMem_Free(size)


cdef class _FusionState:
    """The part of an mcr.Fusion that its compiled fast path (_fuse_quick)
    reads and updates: the communicator (its timeout bounds the waits of
    the fused calls), the open buckets by key, the calls fused so far, the
    bucket size in bytes, the next call a decision of rank 0 ends at,
    whether the fusion is closed, and whether rank 0 closes buckets on a
    timer (the Python path then decides)."""
    cdef public Comm comm
    cdef public dict open
    cdef public Py_ssize_t count
    cdef public Py_ssize_t limit
    cdef public Py_ssize_t next_at
    cdef public bint closed
    cdef public bint timed


def _fuse_quick(_FusionState f, sendbuf, recvbuf, op, backend):
    """mcr.Fusion.Iallreduce's common case, compiled: `recvbuf` (and
    `sendbuf`, or IN_PLACE) contiguous host tensors the core reads directly,
    whose call fits in the open bucket of its kind, with nothing else due
    (see Fusion.Iallreduce). Adds the call and returns its Request, or
    returns None, touching nothing: the Python path decides."""
    global torch_dtypes
    cdef bufinfo r, s
    if not fast_ok or type(recvbuf) is not _Tensor or fast_tensor_info(recvbuf, &r) != 0:
        return None
    inp = recvbuf
    if sendbuf is not IN_PLACE:
        if type(sendbuf) is not _Tensor or fast_tensor_info(sendbuf, &s) != 0 \
                or s.nbytes != r.nbytes or s.tindex != r.tindex:
            return None
        inp = sendbuf
    if torch_dtypes is None:
        torch_dtypes = [getattr(_torch, name, None) for name in TYPE_NAMES]
    b = f.open.get((id(op), torch_dtypes[r.tindex], -1, backend))
    if b is None or f.closed or f.timed:
        return None
    cdef Py_ssize_t index = f.count
    if <Py_ssize_t>b.nbytes + r.nbytes >= f.limit or not (index & 31) or index >= f.next_at:
        return None
    f.count = index + 1
    return fused_request(f, b.add(index, inp, recvbuf, r.nbytes // <Py_ssize_t>b.itemsize),
                         index)


def _fused_request(_FusionState f, list handles, Py_ssize_t index):
    """The Request of fused call `index`, waiting on `handles` ([its
    bucket]; see _work_request): its waits last at most the timeout of the
    fusion's communicator, as that communicator's own requests' do."""
    return fused_request(f, handles, index)


cdef inline Request fused_request(_FusionState f, list handles, Py_ssize_t index):
    cdef Request req = Request.__new__(Request)
    cdef _Work w = _Work.__new__(_Work)
    w.backend = "fusion"
    w.works = handles
    w.steps = []
    req.ext = w
    watch_fused(req, f.comm, handles, index)
    return req
