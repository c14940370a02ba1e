# Turning Python objects into (address, bytes, element type): torch tensors
# through their C-level descriptors, everything else through the buffer
# protocol or DLPack (asdlpack.pxi).

cdef extern from "Python.h":
    int PyObject_CheckBuffer(object)

cdef extern from "mcr/pyfast.h":
    object mcr_call0(object descr, object self)
    object mcr_getattr(object descr, object self)

import sys as _sys


cdef struct bufinfo:
    char *addr
    Py_ssize_t nbytes
    int tindex           # element type (index into TYPES)
    int device           # CUDA device ordinal, or -1 for host memory


cdef class _View:
    """Holds a buffer-protocol view until the communication is over."""
    cdef Py_buffer view
    cdef bint held

    def __dealloc__(self):
        if self.held:
            PyBuffer_Release(&self.view)


# torch, bound the first time a tensor may exist (when torch is imported)
cdef object _Tensor = None           # torch.Tensor: exact-type fast path
cdef object _TensorBase = None       # torch._C.TensorBase: subclasses
cdef object _d_data_ptr, _d_numel, _d_is_contiguous, _d_is_conj, _d_is_neg
cdef object _g_dtype, _g_is_cpu, _g_is_cuda, _g_layout, _g_is_nested
cdef object _torch = None


cdef int bind_torch() except -1:
    global _Tensor, _TensorBase, _torch
    global _d_data_ptr, _d_numel, _d_is_contiguous, _d_is_conj, _d_is_neg
    global _g_dtype, _g_is_cpu, _g_is_cuda, _g_layout, _g_is_nested
    import torch
    base = torch._C.TensorBase
    attrs = base.__dict__
    _d_data_ptr = attrs["data_ptr"]
    _d_numel = attrs["numel"]
    _d_is_contiguous = attrs["is_contiguous"]
    _d_is_conj = attrs["is_conj"]
    _d_is_neg = attrs["is_neg"]
    _g_dtype = attrs["dtype"]
    _g_is_cpu = attrs["is_cpu"]
    _g_is_cuda = attrs["is_cuda"]
    _g_layout = attrs["layout"]
    _g_is_nested = attrs["is_nested"]
    bind_torch_dtypes(torch)
    _torch = torch
    _TensorBase = base
    _Tensor = torch.Tensor
    bind_fast_tensors(torch)
    return 0


cdef inline bint torch_loaded() noexcept:
    return _Tensor is not None


cdef int slow_tensor_info(object t, bufinfo *b, const char *arg) except -1:
    """Fill `b` from a CPU or CUDA torch tensor through torch's Python API;
    reject what cannot be communicated directly, with the reason."""
    cdef int device = -1
    if mcr_getattr(_g_is_cpu, t) is not True:
        if mcr_getattr(_g_is_cuda, t) is not True:
            raise TypeError(f"{arg.decode()}: tensor on device {t.device} is not "
                            "supported (mcr handles CPU and CUDA tensors)")
        device = t.device.index
    cdef int tindex = torch_type_index(mcr_getattr(_g_dtype, t))
    if tindex < 0:
        raise TypeError(f"{arg.decode()}: tensor dtype {t.dtype} is not supported; "
                        f"supported: {', '.join(TYPE_NAMES)}")
    try:
        contiguous = mcr_call0(_d_is_contiguous, t)
    except RuntimeError:
        raise not_strided(t, arg) from None
    if mcr_getattr(_g_layout, t) is not _torch.strided or mcr_getattr(_g_is_nested, t):
        raise not_strided(t, arg)       # (a mkldnn or nested tensor says it is contiguous)
    if contiguous is not True:
        raise BufferError(f"{arg.decode()}: tensor is not contiguous (shape "
                          f"{tuple(t.shape)}, strides {t.stride()}); pass t.contiguous()")
    # lazy conjugate/negative views: memory holds the values before the lazy op
    if TYPES[tindex].category == CAT_COMPLEX and mcr_call0(_d_is_conj, t) is True:
        raise BufferError(f"{arg.decode()}: tensor has its conjugate bit set, its memory "
                          "holds the unconjugated values; pass t.resolve_conj()")
    if mcr_call0(_d_is_neg, t) is True:
        raise BufferError(f"{arg.decode()}: tensor has its negative bit set, its memory "
                          "holds the values before negation; pass t.resolve_neg()")
    b.addr = <char*>PyLong_AsVoidPtr(mcr_call0(_d_data_ptr, t))
    b.nbytes = PyLong_AsSsize_t(mcr_call0(_d_numel, t)) * TYPES[tindex].itemsize
    if b.addr == NULL and b.nbytes > 0:
        raise BufferError(f"{arg.decode()}: tensor of {t.numel()} elements has no memory "
                          "(data_ptr() is 0, as a ZeroTensor's); pass t.clone()")
    b.tindex = tindex
    b.device = device
    return 0


cdef object not_strided(object t, const char *arg):
    """The TypeError for a tensor that is not dense and torch.strided."""
    what = f"{'nested tensor' if t.is_nested else 'tensor'} with layout {t.layout}"
    return TypeError(f"{arg.decode()}: {what} is not supported (only dense, torch.strided "
                     "tensors)")


cdef object view_info(object obj, bufinfo *b, bint writable, bint typed, const char *arg):
    """Fill `b` through the buffer protocol; return the view that holds it.
    `typed`: an explicit datatype gives the element type, so the buffer's
    format (any, even a struct or a foreign byte order) is not read."""
    cdef _View v = _View.__new__(_View)
    cdef int flags = PyBUF_ANY_CONTIGUOUS if typed else PyBUF_FORMAT | PyBUF_ANY_CONTIGUOUS
    if writable:
        flags |= PyBUF_WRITABLE
    try:
        PyObject_GetBuffer(obj, &v.view, flags)
    except (BufferError, ValueError, TypeError) as exc:   # numpy raises ValueError
        if writable:
            try:
                PyObject_GetBuffer(obj, &v.view, flags & ~PyBUF_WRITABLE)
            except (BufferError, ValueError, TypeError):
                pass
            else:
                PyBuffer_Release(&v.view)
                raise BufferError(f"{arg.decode()}: buffer of {type(obj).__name__} "
                                  "is read-only, a receive buffer must be writable") from None
        raise BufferError(f"{arg.decode()}: cannot use the buffer of "
                          f"{type(obj).__name__}: {exc}") from None
    v.held = True
    cdef int tindex = -1
    if not typed:
        fmt = v.view.format.decode() if v.view.format != NULL else "B"
        tindex = format_type_index(fmt, v.view.itemsize, arg)
        if v.view.itemsize != TYPES[tindex].itemsize:
            raise BufferError(f"{arg.decode()}: buffer format {fmt!r} has item size "
                              f"{v.view.itemsize}, expected {TYPES[tindex].itemsize}")
    b.addr = <char*>v.view.buf
    b.nbytes = v.view.len
    b.tindex = tindex
    b.device = -1
    return v


cdef object as_buffer(object obj, bufinfo *b, bint writable, bint typed, const char *arg):
    """Fill `b` from any supported buffer; return the object keeping it alive.
    `typed`: the message gives an explicit datatype (see view_info); `b.tindex`
    may then be -1."""
    if type(obj) is _Tensor:
        tensor_info(obj, b, arg)
        return obj
    if not torch_loaded() and "torch" in _sys.modules:
        bind_torch()
        return as_buffer(obj, b, writable, typed, arg)
    if _TensorBase is not None and isinstance(obj, _TensorBase):
        tensor_info(obj, b, arg)
        return obj
    if PyObject_CheckBuffer(obj):
        return view_info(obj, b, writable, typed, arg)
    if hasattr(obj, "__dlpack__"):
        return dlpack_info(obj, b, writable, arg)
    if hasattr(obj, "__cuda_array_interface__"):
        if not torch_loaded():
            bind_torch()
        if not _torch.cuda.is_available():
            raise TypeError(f"{arg.decode()}: CUDA buffer ({type(obj).__name__}) but torch "
                            "sees no CUDA device; mcr reads CUDA memory through torch")
        try:
            tensor = _torch.as_tensor(obj)   # shares the memory, on the object's device
        except (TypeError, ValueError, RuntimeError) as exc:
            typestr = getattr(obj, "__cuda_array_interface__", {}).get("typestr")
            raise TypeError(
                f"{arg.decode()}: {type(obj).__name__} cannot be read through "
                f"__cuda_array_interface__ (typestr {typestr!r}: torch says {exc}); "
                "pass a torch tensor or an object with __dlpack__ (the interface "
                "has no type string for bfloat16)") from None
        tensor_info(tensor, b, arg)
        return tensor
    raise TypeError(f"{arg.decode()}: expected a torch.Tensor, a numpy array or an "
                    f"object with the buffer protocol, got {type(obj).__name__}")
