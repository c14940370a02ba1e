# Module initialization: check the libmpi first. Nothing here calls an MPI
# function that needs MPI_Init: a program may import mcr with
# ``mpi4py.rc.initialize = False`` and call ``MPI.Init()`` later. What needs
# MPI is made at first use: the float16/bfloat16 ops (opimpl.pxi), TAG_UB
# (Comm.pyx), the progress communicator (progress.pxi).

cdef int initialize() except -1:
    check_same_libmpi()
    init_type_table()
    init_ops()
    return 0


cdef extern from "mcr/cudaaware.h" nogil:
    int mcr_mpi_cuda_aware()


def _mpi_cuda_aware():
    """1 if the MPI library reads CUDA memory, 0 if not, -1 if it cannot tell."""
    return mcr_mpi_cuda_aware()

initialize()

COMM_WORLD = predefined_comm(MPI_COMM_WORLD)
COMM_SELF = predefined_comm(MPI_COMM_SELF)
