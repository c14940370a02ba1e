"""The one list of mpi4py tests the conformance test does not run, each with its reason.

A pattern is a test id (``module.Class.test``), a prefix of one (a module or
a class), or an ``fnmatch`` pattern; ``arrayimpl.<class>`` names an array type
that mpi4py's buffer tests loop over, left out of every loop. Only tests whose subject mcr does not
claim belong here; a failing test of something mcr claims is an mcr bug to fix,
not an exclusion. docs/conf.py renders this table into docs/porting.rst.
"""

CUDA_HOST = ("host memory presented as CUDA memory (mpi4py's fake GPU buffers): mcr reads "
             "CUDA memory through torch, so it refuses such an object with a TypeError")

EXCLUSIONS = [
    # array types that mpi4py's buffer tests loop over (arrayimpl.ArrayBackends)
    ("arrayimpl.FakeGPUArrayBasic", CUDA_HOST + " (``__cuda_array_interface__`` on an "
     "``array.array``)"),
    ("arrayimpl.FakeGPUArrayNumPy", CUDA_HOST + " (``__cuda_array_interface__`` on a numpy "
     "array)"),
    # tests
    ("test_msgspec.TestMessageCAIBuf", CUDA_HOST + " (``__cuda_array_interface__``)"),
    ("test_msgspec.TestMessageSimpleCAIBuf", CUDA_HOST + " (``__cuda_array_interface__``)"),
    ("test_msgspec.TestMessageVectorCAIBuf", CUDA_HOST + " (``__cuda_array_interface__``)"),
    ("test_msgspec.TestMessageSimpleDLPackGPUBuf", CUDA_HOST + " (DLPack, device kDLCUDA)"),
    ("test_msgspec.TestMessageSimpleDLPackGPUBufV0", CUDA_HOST + " (DLPack, device kDLCUDA)"),
    ("test_spawn",
     "dynamic processes (``Spawn``, ``Spawn_multiple``): mpi4py's own methods, which mcr "
     "does not claim, and the slowest module (about 50 s at each size)"),
    ("test_package.TestMPIABI.testGetFromLibMPI",
     "loads ``mpi4py.MPI.__file__`` as the MPI shared library; ``mcr.MPI`` is a Python "
     "module, and MPI is reached through mpi4py's own extension"),
    ("test_package.TestMPIABI.testLibMPI",
     "loads ``mpi4py.MPI.__file__`` as the MPI shared library, as above"),
]
