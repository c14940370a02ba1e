# cython: embedsignature=True
"""mcr's compiled core: message parsing, validation, the MPI backend, and the
requests and progress shared by all backends.

The core calls the MPI C API directly (through mpi4py's ``libmpi`` declarations)
with the GIL released. Its classes extend mpi4py's, so a ``mcr.Comm`` is an
``mpi4py.MPI.Intracomm`` and a ``mcr.Request`` an ``mpi4py.MPI.Request``.
The module is a list of includes, one concern each.
"""

from mpi4py.libmpi cimport *
from mpi4py cimport MPI as _MPI
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBuffer_FillInfo,
                             PyBUF_FORMAT, PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE,
                             PyBUF_ANY_CONTIGUOUS)
from cpython.long cimport PyLong_AsVoidPtr, PyLong_AsSsize_t
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.ref cimport PyObject, Py_INCREF, Py_REFCNT
from libc.limits cimport INT_MAX
from libc.string cimport memcmp, memcpy, memset

from mpi4py import MPI as _mpi4py

include "libcheck.pxi"
include "services.pxi"
include "typetable.pxi"
include "opimpl.pxi"
include "asbuffer.pxi"
include "asdlpack.pxi"
include "astensor.pxi"
include "msgbuffer.pxi"
include "dispatch.pxi"
include "chain.pxi"
include "Exception.pyx"
include "Status.pyx"
include "staging.pxi"
include "completion.pxi"
include "progress.pxi"
include "Request.pyx"
include "isendrecv.pxi"
include "calls.pxi"
include "commlog.pxi"
include "compression.pxi"
include "fuseimpl.pxi"
include "auto.pxi"
include "checkimpl.pxi"
include "Comm.pyx"
include "ops.pxi"
include "neighbor.pxi"
include "initialize.pxi"
