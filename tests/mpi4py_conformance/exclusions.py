"""The one list of mpi4py tests the conformance test does not run, each with its reason.

A pattern is a test id (``module.Class.test``), a prefix of one, or an ``fnmatch`` pattern;
``arrayimpl.<class>``: an array type left out of every loop of mpi4py's buffer tests. Only
tests whose subject mcr does not claim belong here (a failing test of what mcr claims is a
bug to fix). ``MPICH_ONLY`` is left out where the MPI library is MPICH; ``ONE_PROCESS`` runs at
one process only. docs/conf.py renders the tables into docs/porting.rst.
"""

CUDA_HOST = ("host memory presented as CUDA memory (mpi4py's fake GPU buffers): mcr reads "
             "CUDA memory through torch, so it refuses such an object with a TypeError")

PKL5_INTER = ("an artifact of the harness: ``mpi4py.util.pkl5`` derives its ``Intercomm`` "
              "from the package's ``MPI.Comm``, which the harness sets to ``mcr.MPI`` (an "
              "intracommunicator class); in a ported program ``mpi4py.util`` keeps mpi4py's own "
              "``MPI``")

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
    ("test_spawn", "dynamic processes (``Spawn``, ``Spawn_multiple``): mpi4py's own methods, "
     "which mcr does not claim, and the slowest module (about 50 s at each size)"),
    ("test_msgspec.TestMessageVectorW.testMessageCAIBuf",
     CUDA_HOST + " (``__cuda_array_interface__``)"),
    ("test_util_pkl5.TestPKL5World.test*Inter", PKL5_INTER),
    ("test_util_pkl5.TestPKL5World.testBigMPI", PKL5_INTER + " (it runs testBcastInter)"),
    ("test_util_pkl5.TestPKL5Self.test*Inter", PKL5_INTER),
    ("test_util_pkl5.TestPKL5Self.testBigMPI", PKL5_INTER + " (it runs testBcastInter)"),
]

MPICH_ONLY = [
    ("test_mpiapi", "mpi4py's check of its own C declarations: it reads ``libmpi.pxd`` beside the "
     "``MPI`` module's file, which is ``mcr/MPI.py`` here; mcr declares no MPI API. It runs only "
     "on an MPI-4 library (MPICH 5.0.2; Open MPI 5.0.11 reports MPI 3.1, and mpi4py skips it)"),
    ("test_mpiabi.TestMPIABI.testGetFortranInfo", "fails with mpi4py alone on the ``mpich`` "
     "5.0.2 wheel: the library reports ``LOGICAL1`` ... ``LOGICAL16``, ``INTEGER16``, ``REAL2`` "
     "and ``COMPLEX4`` as supported, but their handles are ``DATATYPE_NULL``; mcr claims no "
     "Fortran datatypes (it passes on Open MPI)"),
]

# modules that communicate nothing run at one process only: at more, each rank would run the
# same process-local calls again (their tests name no communicator), about 30 s of the cores;
# at one process, some in a process of their own beside the job of the rest (driver.APART)
LOCAL = "datatypes are local to a process: its tests name no communicator"
ONE_PROCESS = [
    ("test_datatype", LOCAL + " (constructors, envelopes, pickling: 10 s at one process)"),
    ("test_util_dtlib", LOCAL + " (``mpi4py.util.dtlib``'s numpy dtypes to MPI datatypes and "
     "back, through ``mcr.MPI``: 19 s at one process)"),
    ("test_pack", "packing is local to a process: its tests name ``COMM_SELF`` only "
     "(``Pack``, ``Unpack``, ``Pack_external`` and their sizes: 2 s at one process)"),
]
