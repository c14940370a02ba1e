"""Buffers as mpi4py reads them: DLPack exporters, long double, explicit datatypes.

- DLPack without torch: a CPU exporter written with ctypes that frees its
  managed tensor when the capsule is collected (as mpi4py's test helper does)
  works in blocking and non-blocking calls, its tensor is handed back exactly
  once and only when the message is done; versioned and 0.x exporters;
  128-bit floats; the read-only flag; and everything malformed (a raw
  capsule, a failing or junk ``__dlpack__``, bad ``__dlpack_device__``,
  negative shapes, gaps, unknown element types, foreign devices, host memory
  claimed as CUDA) raises an exception that names the argument.
- numpy ``longdouble``/``clongdouble`` with their typecodes and MPI
  datatypes, and the reductions MPI allows on them.
- An explicit datatype is trusted over the buffer's format (big-endian
  arrays, structured arrays with a struct datatype, bytearrays); typecode
  ``"c"`` and ``MPI.CHAR`` are the same type.

In-process, on COMM_SELF; expected values come from numpy.
"""

import ctypes
import gc

import numpy as np
import pytest

import mcr
from mcr import MPI

# -- a ctypes DLPack exporter --------------------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class ManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_api = ctypes.pythonapi
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

READ_ONLY, IS_COPIED = 1, 2
KDL_CPU, KDL_CUDA, KDL_OPENCL = 1, 2, 4
_live = {}      # managed tensors by address, freed when their capsule is collected


@CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # DLPack's rule: an unconsumed capsule hands its tensor back; then (as
    # mpi4py's test exporter) the managed tensor's memory goes with the capsule
    for name in (b"dltensor_versioned", b"dltensor"):
        if _api.PyCapsule_IsValid(capsule, name):
            pointer = _api.PyCapsule_GetPointer(capsule, name)
            exporter, managed = _live[pointer]
            managed.deleter(pointer)
    for pointer in [p for p, (_, m) in _live.items() if m.capsule_id == capsule]:
        del _live[pointer]


class Exporter:
    """Exports a numpy array's memory through ``__dlpack__`` (a fresh capsule each
    call); counts the calls of its deleter."""

    def __init__(self, array, versioned=True, flags=0, device=(KDL_CPU, 0), dtype=None,
                 shape=None, strides=None):
        self.array, self.versioned, self.flags, self.device = array, versioned, flags, device
        self.dtype = dtype or (dl_code(array.dtype), array.dtype.itemsize * 8, 1)
        self.shape = array.shape if shape is None else shape
        self.strides = strides
        self.deleted = 0
        self.exported = 0
        self._deleter = DELETER(self._delete)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, copy=None):
        if not self.versioned and max_version is not None:
            raise TypeError("DLPack 0.x: no max_version")
        managed = ManagedVersioned() if self.versioned else Managed()
        if self.versioned:
            managed.major, managed.minor, managed.flags = 1, 0, self.flags
        t = managed.dl_tensor
        t.data = self.array.ctypes.data
        t.device = DLDevice(*self.device)
        t.ndim = len(self.shape)
        t.dtype = DLDataType(*self.dtype)
        managed.shape_array = (ctypes.c_int64 * max(1, t.ndim))(*self.shape)
        t.shape = ctypes.cast(managed.shape_array, ctypes.POINTER(ctypes.c_int64))
        if self.strides is not None:
            managed.strides_array = (ctypes.c_int64 * t.ndim)(*self.strides)
            t.strides = ctypes.cast(managed.strides_array, ctypes.POINTER(ctypes.c_int64))
        managed.deleter = self._deleter
        address = ctypes.addressof(managed)
        capsule = _api.PyCapsule_New(address, b"dltensor_versioned" if self.versioned
                                     else b"dltensor", _capsule_destructor)
        managed.capsule_id = id(capsule)
        _live[address] = (self, managed)
        self.exported += 1
        return capsule

    def _delete(self, pointer):
        self.deleted += 1


def dl_code(dtype):
    return {"b": 6, "i": 0, "u": 1, "f": 2, "c": 5}[dtype.kind]


def sendrecv(send, recv, comm=mcr.COMM_SELF):
    comm.Sendrecv(send, 0, 7, recv, 0, 7)


# -- DLPack ---------------------------------------------------------------------------------

@pytest.mark.parametrize("versioned", [True, False])
def test_dlpack_exporter_freeing_its_tensor_with_the_capsule(versioned):
    src = Exporter(np.arange(5, dtype=np.int32), versioned)
    dst = Exporter(np.zeros(5, dtype=np.int32), versioned)
    sendrecv(src, dst)
    gc.collect()
    np.testing.assert_array_equal(dst.array, np.arange(5))
    assert (src.exported, src.deleted, dst.exported, dst.deleted) == (1, 1, 1, 1)
    assert not _live


def test_dlpack_request_keeps_the_capsule_until_it_completes():
    comm = mcr.COMM_SELF
    dst = Exporter(np.zeros(4))
    req = comm.Irecv(dst, 0, 3)
    gc.collect()
    assert dst.deleted == 0 and len(_live) == 1
    comm.Send(Exporter(np.linspace(0, 1, 4)), 0, 3)
    req.Wait()
    del req
    gc.collect()
    np.testing.assert_array_equal(dst.array, np.linspace(0, 1, 4))
    assert dst.deleted == 1 and not _live
    # persistent: started twice, the tensor handed back once, when the request goes
    preq = comm.Recv_init(dst, 0, 4)
    for value in (1.0, 2.0):
        preq.Start()
        comm.Send(np.full(4, value), 0, 4)
        preq.Wait()
        np.testing.assert_array_equal(dst.array, np.full(4, value))
    assert dst.deleted == 1
    preq.Free()
    del preq
    gc.collect()
    assert dst.deleted == 2 and not _live


def test_dlpack_shapes_orders_and_types():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.zeros(6, np.float32)
    sendrecv(Exporter(a, strides=(3, 1)), out)
    np.testing.assert_array_equal(out, a.ravel())
    sendrecv(Exporter(np.asfortranarray(a), shape=(2, 3), strides=(1, 2)), out)
    np.testing.assert_array_equal(out, np.asfortranarray(a).ravel(order="K"))
    out = np.zeros(1, np.int64)
    sendrecv(Exporter(np.array(9, np.int64)), out)                 # 0-d
    assert out[0] == 9
    sendrecv(Exporter(np.zeros(0, np.int8)), np.zeros(0, np.int8))   # empty
    # complex as two float lanes, bool
    z = np.array([1 + 2j, 3 - 4j], np.complex128)
    out = np.zeros(2, np.complex128)
    sendrecv(Exporter(z, dtype=(2, 64, 2)), out)
    np.testing.assert_array_equal(out, z)
    out = np.zeros(3, np.bool_)
    sendrecv(Exporter(np.array([True, False, True])), out)
    np.testing.assert_array_equal(out, [True, False, True])


def test_dlpack_long_double():
    a = np.arange(4, dtype=np.longdouble) / 3
    out = np.zeros(4, np.longdouble)
    sendrecv(Exporter(a, dtype=(2, 8 * np.dtype(np.longdouble).itemsize, 1)), out)
    np.testing.assert_array_equal(out, a)
    out = np.zeros(4, np.longdouble)
    mcr.COMM_SELF.Allreduce(Exporter(a, dtype=(2, 8 * a.itemsize, 1)), out, op=MPI.MAX)
    np.testing.assert_array_equal(out, a)


def test_dlpack_read_only_is_refused_as_a_receive_buffer():
    src = Exporter(np.arange(3.0), flags=READ_ONLY)
    out = np.zeros(3)
    sendrecv(src, out)                                   # fine to send from
    np.testing.assert_array_equal(out, np.arange(3.0))
    dst = Exporter(np.zeros(3), flags=READ_ONLY)
    with pytest.raises(BufferError, match="recvbuf: .*read-only"):
        sendrecv(np.arange(3.0), dst)
    with pytest.raises(BufferError, match="recvbuf: .*copy"):
        sendrecv(np.arange(3.0), Exporter(np.zeros(3), flags=IS_COPIED))
    np.testing.assert_array_equal(dst.array, np.zeros(3))
    gc.collect()
    assert not _live


class Raising:
    def __dlpack_device__(self):
        return (KDL_CPU, 0)

    def __dlpack__(self, **kwargs):
        raise RuntimeError("exporter broke")


class Returning:
    def __init__(self, value, device=(KDL_CPU, 0)):
        self.value, self.device = value, device

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        return self.value


def test_dlpack_junk_raises_naming_the_argument():
    out = np.zeros(2)
    capsule = np.zeros(2).__dlpack__()
    with pytest.raises(TypeError, match="sendbuf: expected"):
        sendrecv(capsule, out)                           # a raw capsule is no buffer
    with pytest.raises(BufferError, match="sendbuf: __dlpack__ of Raising failed: "
                                          "RuntimeError: exporter broke"):
        sendrecv(Raising(), out)
    for junk in (None, 3, "dltensor", object()):
        with pytest.raises(BufferError, match="sendbuf: __dlpack__ of Returning returned"):
            sendrecv(Returning(junk), out)
    used = np.zeros(2).__dlpack__()
    _api.PyCapsule_SetName(used, b"used_dltensor")
    with pytest.raises(BufferError, match="recvbuf: .*already consumed"):
        sendrecv(np.zeros(2), Returning(used))
    for device, error in ((None, TypeError), ((1,), ValueError), ((1, 0, 1), ValueError),
                          ((None, 0), TypeError), ((1, None), TypeError)):
        with pytest.raises(error, match="sendbuf: __dlpack_device__ of Returning"):
            sendrecv(Returning(capsule, device), out)
    with pytest.raises(TypeError, match="sendbuf: DLPack device type 4 "):
        sendrecv(Exporter(np.zeros(2), device=(KDL_OPENCL, 0)), out)
    gc.collect()
    assert not _live


def test_dlpack_malformed_tensors_are_refused():
    out = np.zeros(8, np.int32)
    a = np.arange(8, dtype=np.int32)
    cases = [
        (Exporter(a, shape=(4,), strides=(2,)), BufferError, "not contiguous"),
        (Exporter(a, shape=(2, 2), strides=(1, 4)), BufferError, "not contiguous"),
        (Exporter(a, shape=(-1,)), BufferError, "invalid shape"),
        (Exporter(a, shape=(1 << 62, 1 << 62)), BufferError, "invalid shape"),
        (Exporter(a, dtype=(6, 1, 1)), TypeError, "element type .* not whole bytes"),
    ]
    for exporter, error, message in cases:
        with pytest.raises(error, match="sendbuf: .*" + message):
            sendrecv(exporter, out)
    # element types mcr does not know are their bytes, as in mpi4py
    for dtype in ((3, 32, 1), (2, 24, 1), (0, 32, 4)):
        out = bytearray(32)
        exporter = Exporter(a, dtype=dtype, shape=(32 * 8 // (dtype[1] * dtype[2]),))
        sendrecv(exporter, out)
        assert out == a.tobytes()
    out = np.zeros(8, np.int32)
    sendrecv([Exporter(a, dtype=(3, 32, 1)), MPI.INT], out)
    np.testing.assert_array_equal(out, a)
    gc.collect()
    assert not _live


def test_host_memory_claimed_as_cuda_gets_mcrs_error():
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    a = np.arange(4, dtype=np.int32)
    fake_dlpack = Exporter(a, device=(KDL_CUDA, 0))

    class FakeCAI:
        __cuda_array_interface__ = {"version": 3, "data": (a.ctypes.data, False),
                                    "typestr": "<i4", "shape": (4,), "strides": None}

    for fake in (fake_dlpack, FakeCAI()):
        with pytest.raises(TypeError, match="sendbuf: CUDA buffer .* but torch sees no "
                                            "CUDA device"):
            sendrecv(fake, np.zeros(4, np.int32))


# -- long double ----------------------------------------------------------------------------

def test_long_double_arrays_typecodes_and_datatypes():
    comm = mcr.COMM_SELF
    a = np.arange(5, dtype=np.longdouble) / 7
    for spec in (a, [a, "g"], [a, MPI.LONG_DOUBLE], [a, 5, MPI.LONG_DOUBLE]):
        out = np.zeros(5, np.longdouble)
        comm.Sendrecv(spec, 0, 0, out, 0, 0)
        np.testing.assert_array_equal(out, a)
    z = a * (1 - 2j)
    for spec in (z, [z, "G"], [z, MPI.C_LONG_DOUBLE_COMPLEX]):
        out = np.zeros(5, np.clongdouble)
        comm.Sendrecv(spec, 0, 0, out, 0, 0)
        np.testing.assert_array_equal(out, z)


@pytest.mark.parametrize("op", ["SUM", "PROD", "MAX", "MIN"])
def test_long_double_reductions(op):
    a = np.arange(1, 5, dtype=np.longdouble) / 3
    out = np.zeros(4, np.longdouble)
    mcr.COMM_SELF.Allreduce(a, out, op=getattr(MPI, op))
    np.testing.assert_array_equal(out, a)
    z = a * 1j
    out = np.zeros(4, np.clongdouble)
    if op in ("SUM", "PROD"):
        mcr.COMM_SELF.Allreduce(z, out, op=getattr(MPI, op))
        np.testing.assert_array_equal(out, z)
    else:
        with pytest.raises(TypeError, match=f"op: MPI.{op} does not apply to clongdouble"):
            mcr.COMM_SELF.Allreduce(z, out, op=getattr(MPI, op))


def test_long_double_bitwise_ops_are_refused():
    a = np.ones(2, np.longdouble)
    with pytest.raises(TypeError, match="op: MPI.BAND does not apply to longdouble"):
        mcr.COMM_SELF.Allreduce(a, np.zeros_like(a), op=MPI.BAND)


# -- explicit datatypes ---------------------------------------------------------------------

def test_explicit_datatype_overrides_the_buffer_format():
    comm = mcr.COMM_SELF
    big = np.arange(4, dtype=">i4")
    out = np.zeros(4, ">i4")
    comm.Sendrecv([big, MPI.INT], 0, 0, [out, MPI.INT], 0, 0)
    np.testing.assert_array_equal(out, big)
    with pytest.raises(BufferError, match="sendbuf: byte order"):
        comm.Sendrecv(big, 0, 0, [out, MPI.INT], 0, 0)     # no datatype: still checked
    # numpy structured arrays with a struct datatype
    rec = np.dtype([("i", "i4"), ("x", "f8"), ("c", "S3")], align=True)
    dt = MPI.Datatype.Create_struct([1, 1, 3], [rec.fields[f][1] for f in rec.names],
                                    [MPI.INT, MPI.DOUBLE, MPI.CHAR]).Create_resized(
                                        0, rec.itemsize).Commit()
    try:
        src = np.array([(1, 0.5, b"ab"), (2, 1.5, b"cd"), (3, 2.5, b"ef")], rec)
        out = np.zeros(3, rec)
        comm.Sendrecv([src, dt], 0, 0, [out, dt], 0, 0)
        np.testing.assert_array_equal(out, src)
        out = np.zeros(3, rec)
        comm.Sendrecv([src, 2, dt], 0, 0, [out, (2, 1), dt], 0, 0)
        np.testing.assert_array_equal(out[1:], src[:2])
    finally:
        dt.Free()
    con = MPI.DOUBLE.Create_contiguous(2).Commit()
    try:
        out = bytearray(32)
        comm.Sendrecv([np.arange(4.0), con], 0, 0, [out, con], 0, 0)
        np.testing.assert_array_equal(np.frombuffer(out), np.arange(4.0))
    finally:
        con.Free()
    out = bytearray(16)
    comm.Sendrecv([np.array([1.5, 2.5]), MPI.DOUBLE], 0, 0, [out, MPI.DOUBLE], 0, 0)
    np.testing.assert_array_equal(np.frombuffer(out), [1.5, 2.5])
    with pytest.raises(ValueError, match="recvbuf: cannot infer count, buffer length 12 "
                                         "is not a multiple of datatype extent 8"):
        comm.Sendrecv(np.zeros(1), 0, 0, [bytearray(12), MPI.DOUBLE], 0, 0)


def test_typecode_c_is_mpi_char():
    comm = mcr.COMM_SELF
    src, out = bytearray(b"mcr!"), bytearray(4)
    comm.Allgather([src, "c"], [out, MPI.CHAR])
    assert out == src
    out = bytearray(4)
    comm.Allgather([src, MPI.CHAR], [out, "c"])
    assert out == src
