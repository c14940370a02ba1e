# DLPack: reading an object that exports its memory through `__dlpack__`.
#
# Host tensors are read here, from the exporter's capsule, without torch: a
# DLPack exporter may free its managed tensor when the capsule is collected
# (mpi4py's test exporter does), so a consumer that outlives the capsule, as a
# torch tensor made by torch.from_dlpack does, calls a freed deleter. mcr
# instead keeps the capsule itself for as long as the message needs the
# memory, and leaves it unconsumed (its name stays "dltensor[_versioned]"):
# by DLPack's rules the capsule's destructor then hands the tensor back to
# the exporter through its deleter, when the message drops the capsule.
# CUDA tensors still go through torch, which handles their streams.

import builtins as _builtins
from libc.stdint cimport uint8_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX
    int PyCapsule_IsValid(object, const char *)
    void *PyCapsule_GetPointer(object, const char *) except? NULL


# dlpack.h (v1.0), the parts mcr reads
cdef enum:
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLCUDAManaged = 13

cdef enum:
    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLBfloat = 4
    kDLComplex = 5
    kDLBool = 6

cdef enum:
    DLPACK_FLAG_BITMASK_READ_ONLY = 1
    DLPACK_FLAG_BITMASK_IS_COPIED = 2

ctypedef struct DLPackVersion:
    uint32_t major
    uint32_t minor

ctypedef struct DLDevice:
    int32_t device_type          # a C enum: int-sized
    int32_t device_id

ctypedef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

ctypedef struct DLTensor:
    void *data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t *shape
    int64_t *strides             # in elements; NULL: C order
    uint64_t byte_offset

ctypedef struct DLManagedTensor:
    DLTensor dl_tensor
    void *manager_ctx
    void *deleter

ctypedef struct DLManagedTensorVersioned:
    DLPackVersion version
    void *manager_ctx
    void *deleter
    uint64_t flags
    DLTensor dl_tensor


cdef class _DLPackView:
    """Holds an exporter's DLPack capsule (and the exporter) until the
    communication is over; dropping the capsule returns the tensor."""
    cdef object capsule
    cdef object exporter

    def __dealloc__(self):
        # The capsule's destructor may run Python code (a ctypes exporter's
        # does), which fails if an exception is propagating, as when a bad
        # argument drops this message: here Cython has set the error aside.
        self.capsule = None


cdef int type_of_bits(int bits, int t0, int t1, int t2, int t3) noexcept:
    """The first of the types t0..t3 (-1: none) that is `bits` wide, or -1."""
    cdef int candidates[4]
    cdef int tindex
    candidates[:] = [t0, t1, t2, t3]
    for tindex in candidates:
        if tindex >= 0 and TYPES[tindex].itemsize * 8 == bits:
            return tindex
    return -1


cdef int dlpack_type_index(DLDataType dtype) noexcept:
    """Type index of a DLPack element type, or -1."""
    cdef int code = dtype.code, bits = dtype.bits
    if dtype.lanes == 2 and code == kDLFloat:       # (re, im) pairs: complex
        code, bits = kDLComplex, 2 * bits
    elif dtype.lanes != 1:
        return -1
    if code == kDLBool:
        return T_BOOL if bits == 8 else -1
    if code == kDLInt:
        return type_of_bits(bits, T_INT8, T_INT16, T_INT32, T_INT64)
    if code == kDLUInt:
        return type_of_bits(bits, T_UINT8, T_UINT16, T_UINT32, T_UINT64)
    if code == kDLBfloat:
        return T_BFLOAT16 if bits == 16 else -1
    if code == kDLFloat:
        return type_of_bits(bits, T_FLOAT16, T_FLOAT32, T_FLOAT64, T_LONGDOUBLE)
    if code == kDLComplex:
        return type_of_bits(bits, T_COMPLEX64, T_COMPLEX128, T_CLONGDOUBLE, -1)
    return -1


cdef bint dlpack_contiguous(const DLTensor *t) noexcept:
    """Whether the tensor's elements are one block, in C or Fortran order."""
    if t.strides == NULL:
        return True
    cdef int i
    cdef int64_t c_size = 1, f_size = 1
    cdef bint c_order = True, f_order = True
    for i in range(t.ndim):
        if t.shape[i] == 0:
            return True
    for i in range(t.ndim):
        if t.shape[t.ndim - 1 - i] > 1 and t.strides[t.ndim - 1 - i] != c_size:
            c_order = False
        c_size *= t.shape[t.ndim - 1 - i]
        if t.shape[i] > 1 and t.strides[i] != f_size:
            f_order = False
        f_size *= t.shape[i]
    return c_order or f_order


cdef object dlpack_device(object obj, const char *arg):
    """`obj.__dlpack_device__()` checked, as (device type, id), or None if absent."""
    try:
        method = obj.__dlpack_device__
    except AttributeError:
        return None
    name = type(obj).__name__
    if not callable(method):
        raise TypeError(f"{argstr(arg)}: __dlpack_device__ of {name} is not callable")
    device = method()
    if not isinstance(device, tuple):
        raise TypeError(f"{argstr(arg)}: __dlpack_device__ of {name} returned "
                        f"{type(device).__name__}, expected a (device type, id) tuple")
    if len(device) != 2:
        raise ValueError(f"{argstr(arg)}: __dlpack_device__ of {name} returned "
                         f"{len(device)} items, expected (device type, id)")
    if not all(isinstance(item, int) for item in device):
        raise TypeError(f"{argstr(arg)}: __dlpack_device__ of {name} returned {device!r}, "
                        "expected two integers")
    return device


cdef object dlpack_capsule(object obj, const char *arg):
    """A capsule from `obj.__dlpack__`, asking for DLPack 1.x and no copy
    (a copy would not receive), as older exporters are asked otherwise."""
    name = type(obj).__name__
    try:
        try:
            return obj.__dlpack__(max_version=(1, 0), copy=False)
        except TypeError:                        # DLPack 0.x: no keywords
            return obj.__dlpack__()
    except _builtins.Exception as exc:        # the module's Exception is mcr's
        raise BufferError(f"{argstr(arg)}: __dlpack__ of {name} failed: "
                          f"{type(exc).__name__}: {exc}") from exc


cdef object dlpack_info(object obj, bufinfo *b, bint writable, const char *arg):
    """Fill `b` from an object with `__dlpack__`; return what keeps it alive."""
    name = type(obj).__name__
    device = dlpack_device(obj, arg)
    if device is not None and device[0] in (kDLCUDA, kDLCUDAManaged):
        return cuda_dlpack_info(obj, b, arg)
    if device is not None and device[0] not in (kDLCPU, kDLCUDAHost):
        raise TypeError(f"{argstr(arg)}: DLPack device type {device[0]} of {name} is not "
                        "supported (mcr reads host and CUDA memory)")
    # held from the start, so that any error below releases it through the holder
    cdef _DLPackView holder = _DLPackView.__new__(_DLPackView)
    holder.exporter = obj
    holder.capsule = dlpack_capsule(obj, arg)
    cdef DLManagedTensorVersioned *versioned = NULL
    cdef DLTensor *t
    if PyCapsule_IsValid(holder.capsule, b"dltensor_versioned"):
        versioned = <DLManagedTensorVersioned*>PyCapsule_GetPointer(holder.capsule,
                                                                  b"dltensor_versioned")
        if versioned.version.major != 1:
            raise BufferError(f"{argstr(arg)}: DLPack version {versioned.version.major}."
                              f"{versioned.version.minor} of {name} is not supported "
                              "(mcr reads 1.x)")
        t = &versioned.dl_tensor
    elif PyCapsule_IsValid(holder.capsule, b"dltensor"):
        t = &(<DLManagedTensor*>PyCapsule_GetPointer(holder.capsule, b"dltensor")).dl_tensor
    elif (PyCapsule_IsValid(holder.capsule, b"used_dltensor") or
          PyCapsule_IsValid(holder.capsule, b"used_dltensor_versioned")):
        raise BufferError(f"{argstr(arg)}: __dlpack__ of {name} returned a capsule that "
                          "was already consumed")
    else:
        raise BufferError(f"{argstr(arg)}: __dlpack__ of {name} returned "
                          f"{type(holder.capsule).__name__}, expected a DLPack capsule")
    if t.device.device_type in (kDLCUDA, kDLCUDAManaged):
        raise TypeError(f"{argstr(arg)}: DLPack tensor of {name} is on a CUDA device; mcr "
                        "reads one through torch, which needs __dlpack_device__")
    if t.device.device_type not in (kDLCPU, kDLCUDAHost):
        raise TypeError(f"{argstr(arg)}: DLPack device type {t.device.device_type} of "
                        f"{name} is not supported (mcr reads host and CUDA memory)")
    if writable and versioned != NULL:
        if versioned.flags & DLPACK_FLAG_BITMASK_READ_ONLY:
            raise BufferError(f"{argstr(arg)}: DLPack tensor of {name} is read-only, a "
                              "receive buffer must be writable")
        if versioned.flags & DLPACK_FLAG_BITMASK_IS_COPIED:
            raise BufferError(f"{argstr(arg)}: DLPack tensor of {name} is a copy, what "
                              "is received into it would be lost")
    # the shape, checked before it is trusted
    cdef int i
    cdef Py_ssize_t nelems = 1
    if t.ndim < 0 or (t.ndim > 0 and t.shape == NULL):
        raise BufferError(f"{argstr(arg)}: DLPack tensor of {name} has an invalid shape "
                          f"(ndim {t.ndim})")
    for i in range(t.ndim):
        if t.shape[i] < 0 or (t.shape[i] and nelems > PY_SSIZE_T_MAX // t.shape[i]):
            raise BufferError(f"{argstr(arg)}: DLPack tensor of {name} has an invalid "
                              f"shape {[t.shape[j] for j in range(t.ndim)]}")
        nelems *= t.shape[i]
    if not dlpack_contiguous(t):
        raise BufferError(f"{argstr(arg)}: DLPack tensor of {name} is not contiguous "
                          f"(shape {[t.shape[j] for j in range(t.ndim)]}, strides "
                          f"{[t.strides[j] for j in range(t.ndim)]})")
    # an element type mcr does not know is its bytes, as in mpi4py
    cdef int tindex = dlpack_type_index(t.dtype)
    cdef Py_ssize_t itemsize
    if tindex >= 0:
        itemsize = TYPES[tindex].itemsize
    elif t.dtype.lanes > 0 and t.dtype.bits > 0 and t.dtype.bits % 8 == 0:
        itemsize = t.dtype.bits // 8 * t.dtype.lanes
        tindex = T_UINT8
    else:
        raise TypeError(f"{argstr(arg)}: DLPack element type (code {t.dtype.code}, bits "
                        f"{t.dtype.bits}, lanes {t.dtype.lanes}) of {name} is not "
                        "whole bytes")
    if nelems > PY_SSIZE_T_MAX // itemsize:
        raise BufferError(f"{argstr(arg)}: DLPack tensor of {name} has an invalid "
                          f"shape {[t.shape[j] for j in range(t.ndim)]}")
    if t.data == NULL and nelems:
        raise BufferError(f"{argstr(arg)}: DLPack tensor of {name} has no data")
    b.addr = <char*>t.data + t.byte_offset
    b.nbytes = nelems * itemsize
    b.tindex = tindex
    b.device = -1
    return holder


cdef object cuda_dlpack_info(object obj, bufinfo *b, const char *arg):
    """CUDA memory through torch, which synchronizes with the exporter's stream."""
    if not torch_loaded():
        bind_torch()
    if not _torch.cuda.is_available():
        raise TypeError(f"{argstr(arg)}: CUDA buffer ({type(obj).__name__}) but torch "
                        "sees no CUDA device; mcr reads CUDA memory through torch")
    tensor = _torch.from_dlpack(obj)
    tensor_info(tensor, b, arg)
    return tensor
