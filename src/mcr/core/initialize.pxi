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
    return 0

initialize()

COMM_WORLD = Comm(_mpi4py.COMM_WORLD)
COMM_SELF = Comm(_mpi4py.COMM_SELF)
