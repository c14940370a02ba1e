"""Buffers as mpi4py reads them: DLPack exporters, long double, explicit datatypes.

A ctypes DLPack exporter (no torch) whose capsule frees its managed tensor, as mpi4py's test
helper's does: its tensor is handed back once, when the message is done; versioned and 0.x;
malformed exporters raise naming the argument. numpy longdouble/clongdouble with their typecodes,
datatypes and reductions; explicit datatypes trusted over the buffer's format. In-process, on
COMM_SELF; expected values come from numpy.
"""

import array
import ctypes
import gc
import re

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
for _name, _res, _args in [("New", ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                      CAPSULE_DESTRUCTOR]),
                           ("IsValid", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]),
                           ("GetPointer", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
                           ("SetName", ctypes.c_int, [ctypes.py_object, ctypes.c_char_p])]:
    getattr(_api, "PyCapsule_" + _name).restype = _res
    getattr(_api, "PyCapsule_" + _name).argtypes = _args

READ_ONLY, IS_COPIED = 1, 2
KDL_CPU, KDL_CUDA, KDL_OPENCL = 1, 2, 4
_live = {}      # managed tensors by address, freed when their capsule is collected


@CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # DLPack's rule: an unconsumed capsule hands its tensor back; then (as mpi4py's test exporter)
    # the managed tensor's memory goes with the capsule
    for name in (b"dltensor_versioned", b"dltensor"):
        if _api.PyCapsule_IsValid(capsule, name):
            pointer = _api.PyCapsule_GetPointer(capsule, name)
            _live[pointer][1].deleter(pointer)
    for pointer in [p for p, (_, m) in _live.items() if m.capsule_id == capsule]:
        del _live[pointer]


class Exporter:
    """Exports a numpy array's memory through ``__dlpack__`` (a fresh capsule each call); counts the
    calls of its deleter."""

    def __init__(self, array, versioned=True, flags=0, device=(KDL_CPU, 0), dtype=None,
                 shape=None, strides=None):
        self.array, self.versioned, self.flags, self.device = array, versioned, flags, device
        self.dtype = dtype or ({"b": 6, "i": 0, "u": 1, "f": 2, "c": 5}[array.dtype.kind],
                               array.dtype.itemsize * 8, 1)
        self.shape = array.shape if shape is None else shape
        self.strides, self.deleted, self.exported = strides, 0, 0
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
        t.data, t.device, t.ndim = self.array.ctypes.data, DLDevice(*self.device), len(self.shape)
        t.dtype = DLDataType(*self.dtype)
        managed.shape_array = (ctypes.c_int64 * max(1, t.ndim))(*self.shape)
        t.shape = ctypes.cast(managed.shape_array, ctypes.POINTER(ctypes.c_int64))
        if self.strides is not None:
            managed.strides_array = (ctypes.c_int64 * t.ndim)(*self.strides)
            t.strides = ctypes.cast(managed.strides_array, ctypes.POINTER(ctypes.c_int64))
        managed.deleter, address = self._deleter, ctypes.addressof(managed)
        capsule = _api.PyCapsule_New(address, b"dltensor_versioned" if self.versioned
                                     else b"dltensor", _capsule_destructor)
        managed.capsule_id, _live[address] = id(capsule), (self, managed)
        self.exported += 1
        return capsule

    def _delete(self, pointer):
        self.deleted += 1


def sendrecv(send, recv, comm=mcr.COMM_SELF):
    comm.Sendrecv(send, 0, 7, recv, 0, 7)


def collected():
    """Every capsule gone, every managed tensor handed back."""
    gc.collect()
    assert not _live


# -- DLPack ---------------------------------------------------------------------------------
@pytest.mark.parametrize("versioned", [True, False])
def test_dlpack_exporter_freeing_its_tensor_with_the_capsule(versioned):
    src = Exporter(np.arange(5, dtype=np.int32), versioned)
    dst = Exporter(np.zeros(5, dtype=np.int32), versioned)
    sendrecv(src, dst)
    collected()
    np.testing.assert_array_equal(dst.array, np.arange(5))
    assert (src.exported, src.deleted, dst.exported, dst.deleted) == (1, 1, 1, 1)


def test_dlpack_request_keeps_the_capsule_until_it_completes():
    comm, dst = mcr.COMM_SELF, Exporter(np.zeros(4))
    req = comm.Irecv(dst, 0, 3)
    gc.collect()
    assert dst.deleted == 0 and len(_live) == 1
    comm.Send(Exporter(np.linspace(0, 1, 4)), 0, 3)
    req.Wait()
    del req
    collected()
    np.testing.assert_array_equal(dst.array, np.linspace(0, 1, 4))
    assert dst.deleted == 1
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
    collected()
    assert dst.deleted == 2


def test_dlpack_shapes_orders_and_types():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    z = np.array([1 + 2j, 3 - 4j], np.complex128)
    for exporter, want in [
            (Exporter(a, strides=(3, 1)), a.ravel()),
            (Exporter(np.asfortranarray(a), shape=(2, 3), strides=(1, 2)),
             np.asfortranarray(a).ravel(order="K")),
            (Exporter(np.array(9, np.int64)), np.array([9])),                # 0-d
            (Exporter(np.zeros(0, np.int8)), np.zeros(0, np.int8)),          # empty
            (Exporter(z, dtype=(2, 64, 2)), z),                      # complex as two float lanes
            (Exporter(np.array([True, False, True])), np.array([True, False, True])),
            (Exporter(a.ravel().astype(np.longdouble) / 3,
                      dtype=(2, 8 * np.dtype(np.longdouble).itemsize, 1)),
             a.ravel().astype(np.longdouble) / 3)]:
        out = np.zeros_like(want)
        sendrecv(exporter, out)
        np.testing.assert_array_equal(out, want)
    a = np.arange(4, dtype=np.longdouble) / 3
    out = np.zeros(4, np.longdouble)
    mcr.COMM_SELF.Allreduce(Exporter(a, dtype=(2, 8 * a.itemsize, 1)), out, op=MPI.MAX)
    np.testing.assert_array_equal(out, a)


def test_dlpack_read_only_is_refused_as_a_receive_buffer():
    out = np.zeros(3)
    sendrecv(Exporter(np.arange(3.0), flags=READ_ONLY), out)      # fine to send from
    np.testing.assert_array_equal(out, np.arange(3.0))
    dst = Exporter(np.zeros(3), flags=READ_ONLY)
    with pytest.raises(BufferError, match="recvbuf: .*read-only"):
        sendrecv(np.arange(3.0), dst)
    with pytest.raises(BufferError, match="recvbuf: .*copy"):
        sendrecv(np.arange(3.0), Exporter(np.zeros(3), flags=IS_COPIED))
    np.testing.assert_array_equal(dst.array, np.zeros(3))
    collected()


class Returning:
    """A ``__dlpack__`` that returns `value`, or raises it (an exception)."""

    def __init__(self, value, device=(KDL_CPU, 0)):
        self.value, self.device = value, device

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def test_dlpack_junk_raises_naming_the_argument():
    out = np.zeros(2)
    capsule = np.zeros(2).__dlpack__()
    used = np.zeros(2).__dlpack__()
    _api.PyCapsule_SetName(used, b"used_dltensor")
    cases = [(capsule, TypeError, "sendbuf: expected"),         # a raw capsule is no buffer
             (Returning(RuntimeError("exporter broke")), BufferError,
              "sendbuf: __dlpack__ of Returning failed: RuntimeError: exporter broke"),
             (Exporter(np.zeros(2), device=(KDL_OPENCL, 0)), TypeError,
              "sendbuf: DLPack device type 4 ")]
    cases += [(Returning(junk), BufferError, "sendbuf: __dlpack__ of Returning returned")
              for junk in (None, 3, "dltensor", object())]
    cases += [(Returning(capsule, device), error, "sendbuf: __dlpack_device__ of Returning")
              for device, error in ((None, TypeError), ((1,), ValueError),
                                    ((1, 0, 1), ValueError), ((None, 0), TypeError),
                                    ((1, None), TypeError))]
    for send, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            sendrecv(send, out)
    with pytest.raises(BufferError, match="recvbuf: .*already consumed"):
        sendrecv(np.zeros(2), Returning(used))
    collected()


def test_dlpack_malformed_tensors_are_refused():
    out, a = np.zeros(8, np.int32), np.arange(8, dtype=np.int32)
    for exporter, error, message in [
            (Exporter(a, shape=(4,), strides=(2,)), BufferError, "not contiguous"),
            (Exporter(a, shape=(2, 2), strides=(1, 4)), BufferError, "not contiguous"),
            (Exporter(a, shape=(-1,)), BufferError, "invalid shape"),
            (Exporter(a, shape=(1 << 62, 1 << 62)), BufferError, "invalid shape"),
            (Exporter(a, dtype=(6, 1, 1)), TypeError, "element type .* not whole bytes")]:
        with pytest.raises(error, match="sendbuf: .*" + message):
            sendrecv(exporter, out)
    # element types mcr does not know are their bytes, as in mpi4py
    for dtype in ((3, 32, 1), (2, 24, 1), (0, 32, 4)):
        out = bytearray(32)
        sendrecv(Exporter(a, dtype=dtype, shape=(32 * 8 // (dtype[1] * dtype[2]),)), out)
        assert out == a.tobytes()
    out = np.zeros(8, np.int32)
    sendrecv([Exporter(a, dtype=(3, 32, 1)), MPI.INT], out)
    np.testing.assert_array_equal(out, a)
    collected()


def test_host_memory_claimed_as_cuda_gets_mcrs_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    a = np.arange(4, dtype=np.int32)

    class FakeCAI:
        __cuda_array_interface__ = {"version": 3, "data": (a.ctypes.data, False),
                                    "typestr": "<i4", "shape": (4,), "strides": None}

    for fake in (Exporter(a, device=(KDL_CUDA, 0)), FakeCAI()):
        with pytest.raises(TypeError, match="sendbuf: CUDA buffer .* but torch sees no "
                                            "CUDA device"):
            sendrecv(fake, np.zeros(4, np.int32))


# -- buffer formats -------------------------------------------------------------------------
def test_pointer_and_character_formats_move_as_in_mpi4py():
    """'P' (void*), 'u' (ctypes' wchar_t), 'w' (UCS-4), numpy's one-character strings '1s' and
    '1w'; longer strings ('3s') name the datatype to give instead."""
    wchars = ctypes.c_wchar * 2
    for src, out in [((ctypes.c_void_p * 2)(1, 2**40), (ctypes.c_void_p * 2)()),
                     (wchars("a", "\u20ac"), wchars()),
                     (array.array("u", "a\u20ac"), array.array("u", "zz")),
                     (np.array([b"x", b"y"], "S1"), np.zeros(2, "S1")),
                     (np.array(["x", "\u20ac"], "U1"), np.zeros(2, "U1"))]:
        sendrecv(src, out)
        assert bytes(memoryview(out)) == bytes(memoryview(src)), memoryview(src).format
    src, out = np.array([b"abc", b"de"], "S3"), np.zeros(2, "S3")
    with pytest.raises(TypeError, match="sendbuf: buffer format '3s' has 3 values per element"):
        sendrecv(src, out)
    sendrecv([src, MPI.CHAR], [out, MPI.CHAR])
    np.testing.assert_array_equal(out, src)


# -- long double ----------------------------------------------------------------------------
def test_long_double_typecodes_datatypes_and_reductions():
    a = np.arange(1, 6, dtype=np.longdouble) / 7
    z = a * (1 - 2j)
    for spec, want in [(a, a), ([a, "g"], a), ([a, MPI.LONG_DOUBLE], a),
                       ([a, 5, MPI.LONG_DOUBLE], a),
                       (z, z), ([z, "G"], z), ([z, MPI.C_LONG_DOUBLE_COMPLEX], z)]:
        out = np.zeros_like(want)
        sendrecv(spec, out)
        np.testing.assert_array_equal(out, want)
    for x, name, ops in ((a, "longdouble", ("SUM", "PROD", "MAX", "MIN")),
                         (z, "clongdouble", ("SUM", "PROD"))):
        for op in ("SUM", "PROD", "MAX", "MIN", "BAND"):
            out = np.zeros_like(x)
            if op in ops:
                mcr.COMM_SELF.Allreduce(x, out, op=getattr(MPI, op))
                np.testing.assert_array_equal(out, x)
            else:
                with pytest.raises(TypeError, match=f"op: MPI.{op} does not apply to {name}"):
                    mcr.COMM_SELF.Allreduce(x, out, op=getattr(MPI, op))


# -- explicit datatypes ---------------------------------------------------------------------
def test_explicit_datatype_overrides_the_buffer_format():
    big, out = np.arange(4, dtype=">i4"), np.zeros(4, ">i4")
    sendrecv([big, MPI.INT], [out, MPI.INT])
    np.testing.assert_array_equal(out, big)
    with pytest.raises(BufferError, match="sendbuf: byte order"):
        sendrecv(big, [out, MPI.INT])                       # no datatype: still checked
    # numpy structured arrays with a struct datatype
    rec = np.dtype([("i", "i4"), ("x", "f8"), ("c", "S3")], align=True)
    dt = MPI.Datatype.Create_struct([1, 1, 3], [rec.fields[f][1] for f in rec.names],
                                    [MPI.INT, MPI.DOUBLE, MPI.CHAR]).Create_resized(
                                        0, rec.itemsize).Commit()
    con = MPI.DOUBLE.Create_contiguous(2).Commit()
    try:
        src = np.array([(1, 0.5, b"ab"), (2, 1.5, b"cd"), (3, 2.5, b"ef")], rec)
        out = np.zeros(3, rec)
        sendrecv([src, dt], [out, dt])
        np.testing.assert_array_equal(out, src)
        out = np.zeros(3, rec)
        sendrecv([src, 2, dt], [out, (2, 1), dt])
        np.testing.assert_array_equal(out[1:], src[:2])
        out = bytearray(32)
        sendrecv([np.arange(4.0), con], [out, con])
        np.testing.assert_array_equal(np.frombuffer(out), np.arange(4.0))
    finally:
        dt.Free()
        con.Free()
    out = bytearray(16)
    sendrecv([np.array([1.5, 2.5]), MPI.DOUBLE], [out, MPI.DOUBLE])
    np.testing.assert_array_equal(np.frombuffer(out), [1.5, 2.5])
    with pytest.raises(ValueError, match="recvbuf: cannot infer count, buffer length 12 "
                                         "is not a multiple of datatype extent 8"):
        sendrecv(np.zeros(1), [bytearray(12), MPI.DOUBLE])


def test_typecode_c_is_mpi_char():
    src = bytearray(b"mcr!")
    for send, recv in (("c", MPI.CHAR), (MPI.CHAR, "c")):
        out = bytearray(4)
        mcr.COMM_SELF.Allgather([src, send], [out, recv])
        assert out == src
