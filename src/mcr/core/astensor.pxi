# The fast path for reading torch tensors (the hot path of every call).
#
# torch's Python API costs ~75 ns per attribute, ~450 ns for what a tensor
# needs checking. libtorch also exports a stable C shim (the aoti_torch_*
# functions, C linkage, kept ABI-stable for AOTInductor) that answers the same
# questions on an at::Tensor in a few ns. The at::Tensor lives inside the Python
# tensor object, and the lazy conjugate/negative bits in the TensorImpl's
# dispatch key set. Both offsets are found at first use and the whole fast path
# is checked against the Python API on probe tensors; if anything disagrees,
# mcr keeps using the Python API. Any tensor the fast path is unsure about
# (not CPU, not contiguous, unknown dtype, lazy bits, a shim error) goes to the
# Python API too, which gives the error message. The fast path reads only a
# tensor whose dispatch keys say plain dense memory (Dense, no lazy bit, no
# ZeroTensor, which has no memory): a mkldnn, sparse or nested tensor goes to
# the Python API as well, for the price of the test of the lazy bits.

from libc.stdint cimport int32_t, int64_t, uint64_t, intptr_t

cdef extern from "<dlfcn.h>" nogil:
    void *dlopen(const char *, int)
    void *dlsym(void *, const char *)
    int dlclose(void *)
    int RTLD_LAZY
    int RTLD_NOLOAD

ctypedef int32_t (*get_ptr_fn)(void *, void **) noexcept nogil
ctypedef int32_t (*get_i64_fn)(void *, int64_t *) noexcept nogil
ctypedef int32_t (*get_i32_fn)(void *, int32_t *) noexcept nogil
ctypedef int32_t (*get_bool_fn)(void *, char *) noexcept nogil   # C++ bool: one byte
ctypedef int32_t (*const_fn)() noexcept nogil

cdef enum:
    MAX_DTYPE_CODE = 128

cdef struct tensor_api:
    get_ptr_fn data_ptr
    get_i64_fn numel
    get_i32_fn dtype
    get_i32_fn device_type
    get_bool_fn is_contiguous
    int32_t cpu
    Py_ssize_t handle_offset       # the at::Tensor inside the Python object
    Py_ssize_t keyset_offset       # the DispatchKeySet inside the TensorImpl
    uint64_t plain_mask            # Dense | Conjugate | Negative | ZeroTensor
    uint64_t plain_keys            # of those, what a plain tensor has: Dense
    signed char code_to_type[MAX_DTYPE_CODE]

cdef tensor_api FAST
cdef bint fast_ok = False
cdef object _Parameter = None


cdef inline int fast_tensor_info(object t, bufinfo *b) noexcept:
    """Fill `b` and return 0, or return -1 to leave the tensor to the slow path."""
    cdef void *h = <char*><PyObject*>t + FAST.handle_offset
    cdef int32_t device = -1, code = -1
    cdef char contiguous = 0
    cdef void *ptr = NULL
    cdef int64_t numel = 0
    if FAST.device_type(h, &device) or device != FAST.cpu:
        return -1
    if FAST.dtype(h, &code) or code < 0 or code >= MAX_DTYPE_CODE:
        return -1
    cdef int tindex = FAST.code_to_type[code]
    if tindex < 0 or FAST.is_contiguous(h, &contiguous) or not contiguous:
        return -1
    cdef char *impl = (<char**>h)[0]
    if ((<uint64_t*>(impl + FAST.keyset_offset))[0] & FAST.plain_mask) != FAST.plain_keys:
        return -1
    if FAST.data_ptr(h, &ptr) or FAST.numel(h, &numel):
        return -1
    b.addr = <char*>ptr
    b.nbytes = numel * TYPES[tindex].itemsize
    b.tindex = tindex
    b.device = -1
    return 0


cdef int tensor_info(object t, bufinfo *b, const char *arg) except -1:
    """Fill `b` from a torch tensor; reject what cannot be communicated directly."""
    if fast_ok and (type(t) is _Tensor or type(t) is _Parameter):
        if fast_tensor_info(t, b) == 0:
            return 0
    return slow_tensor_info(t, b, arg)


cdef void *symbol(void *lib, str name):
    return dlsym(lib, name.encode())


cdef Py_ssize_t find_word(list objects, list values, Py_ssize_t start,
                          Py_ssize_t stop) noexcept:
    """The offset in [start, stop) where each object holds its value, or -1."""
    cdef Py_ssize_t off, i
    for off in range(start, stop, 8):
        for i in range(len(objects)):
            if (<uint64_t*>(<char*><intptr_t>objects[i] + off))[0] != <uint64_t>values[i]:
                break
        else:
            return off
    return -1


cdef int bind_fast_tensors(object torch) except -1:
    """Set up the fast path if torch's C shim and layout check out."""
    global fast_ok, _Parameter
    import os
    fast_ok = False
    _Parameter = torch.nn.Parameter
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    cdef void *lib = dlopen(path.encode(), RTLD_LAZY | RTLD_NOLOAD)
    if lib == NULL:
        return 0
    names = ("aoti_torch_get_data_ptr", "aoti_torch_get_numel", "aoti_torch_get_dtype",
             "aoti_torch_get_device_type", "aoti_torch_is_contiguous",
             "aoti_torch_device_type_cpu")
    if any(symbol(lib, name) == NULL for name in names):
        dlclose(lib)
        return 0
    FAST.data_ptr = <get_ptr_fn>symbol(lib, names[0])
    FAST.numel = <get_i64_fn>symbol(lib, names[1])
    FAST.dtype = <get_i32_fn>symbol(lib, names[2])
    FAST.device_type = <get_i32_fn>symbol(lib, names[3])
    FAST.is_contiguous = <get_bool_fn>symbol(lib, names[4])
    FAST.cpu = (<const_fn>symbol(lib, names[5]))()
    cdef int i
    cdef void *fn
    for i in range(MAX_DTYPE_CODE):
        FAST.code_to_type[i] = -1
    for i in range(NTYPES):
        fn = symbol(lib, "aoti_torch_dtype_" + TYPE_NAMES[i])
        if fn != NULL and 0 <= (<const_fn>fn)() < MAX_DTYPE_CODE:
            FAST.code_to_type[(<const_fn>fn)()] = i
    dlclose(lib)          # RTLD_NOLOAD: torch keeps the library loaded

    keys = torch._C._dispatch_keys
    key = torch._C.DispatchKey
    FAST.plain_keys = torch._C.DispatchKeySet(key.Dense).raw_repr()
    FAST.plain_mask = (FAST.plain_keys | torch._C.DispatchKeySet(key.Negative).raw_repr() |
                       torch._C.DispatchKeySet(key.Conjugate).raw_repr() |
                       torch._C.DispatchKeySet(key.ZeroTensor).raw_repr())
    base = torch.arange(12, dtype=torch.float32)
    probes = [base, base[2:7], base.view(3, 4).t(), torch._neg_view(base),
              torch.ones(3, dtype=torch.complex64).conj(), torch.ones(2, requires_grad=True),
              torch.nn.Parameter(torch.ones(2, dtype=torch.float64)),
              torch.zeros(0, dtype=torch.bfloat16), torch.zeros((), dtype=torch.uint8),
              torch.ones(4, dtype=torch.int64).to_sparse()]
    # the at::Tensor (one pointer to the TensorImpl) right after the PyObject
    # header and MaybeOwned's flag; the key set somewhere in the TensorImpl
    FAST.handle_offset = find_word([id(p) for p in probes], [p._cdata for p in probes],
                                   sizeof(PyObject), sizeof(PyObject) + 32)
    if FAST.handle_offset < 0:
        return 0
    FAST.keyset_offset = find_word([p._cdata for p in probes],
                                   [keys(p).raw_repr() for p in probes], 8, 256)
    if FAST.keyset_offset < 0:
        return 0
    # the fast path must agree with the Python API on every probe, and on
    # tensors it must leave to it
    cdef bufinfo fast, slow
    for p in probes + odd_tensors(torch):
        accepted = True
        try:
            slow_tensor_info(p, &slow, b"probe")
        except (TypeError, BufferError):
            accepted = False
        if (fast_tensor_info(p, &fast) == 0) != accepted:
            return 0
        if accepted and (fast.addr != slow.addr or fast.nbytes != slow.nbytes or
                         fast.tindex != slow.tindex):
            return 0
    fast_ok = True
    return 0


cdef list odd_tensors(object torch):
    """Tensors the fast path must leave to the Python API, which refuses
    them: a ZeroTensor, a nested tensor and a mkldnn one, those this torch
    builds."""
    import warnings
    makers = (lambda: torch._efficientzerotensor(3),
              lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
              lambda: torch.ones(3).to_mkldnn())
    odd = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # (nested tensors are a prototype)
        for make in makers:
            try:
                odd.append(make())
            except (AttributeError, RuntimeError):
                pass                            # (not in this torch, or not built in)
    return odd


def _fast_tensor_path():
    """True when mcr reads tensors through torch's C shim (for tests)."""
    return fast_ok
