# Module initialization: check the libmpi first, before any other MPI call.

cdef int initialize() except -1:
    global TAG_UB
    check_same_libmpi()
    init_type_table()
    create_half_ops()
    cdef int *value = NULL
    cdef int flag = 0
    CHKERR(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag))
    if flag and value != NULL:
        TAG_UB = value[0]
    init_progress()
    return 0


cdef extern from "mcr/cudaaware.h" nogil:
    int mcr_mpi_cuda_aware()


def _mpi_cuda_aware():
    """1 if the MPI library reads CUDA memory, 0 if not, -1 if it cannot tell."""
    return mcr_mpi_cuda_aware()

initialize()

COMM_WORLD = Comm(_mpi4py.COMM_WORLD)
COMM_SELF = Comm(_mpi4py.COMM_SELF)
