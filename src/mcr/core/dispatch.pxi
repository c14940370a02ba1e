# The three forms of every operation (include/mcr/dispatch.h).

cdef extern from "mcr/dispatch.h" nogil:
    enum:
        BLOCKING "MCR_BLOCKING"
        NONBLOCKING "MCR_NONBLOCKING"
        PERSISTENT "MCR_PERSISTENT"
        HAVE_PERSISTENT_COLL "MCR_HAVE_PERSISTENT_COLL"
        STANDARD "MCR_STANDARD"
        BUFFERED "MCR_BUFFERED"
        SYNCHRONOUS "MCR_SYNCHRONOUS"
        READY "MCR_READY"
        HAVE_ISENDRECV "MCR_HAVE_ISENDRECV"
        ERR_NO_ISENDRECV "MCR_ERR_NO_ISENDRECV"
        ERR_NO_PERSISTENT "MCR_ERR_NO_PERSISTENT"
    int mcr_send(int, void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*)
    int mcr_recv(int, void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Status*, MPI_Request*)
    int mcr_send_in(int, int, void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*)
    int mcr_sendrecv(int, void*, int, MPI_Datatype, int, int, void*, int, MPI_Datatype, int,
                     int, MPI_Comm, MPI_Status*, MPI_Request*)
    int mcr_sendrecv_replace(int, void*, int, MPI_Datatype, int, int, int, int, MPI_Comm,
                             MPI_Status*, MPI_Request*)
    int mcr_barrier(int, MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_bcast(int, void*, int, MPI_Datatype, int, MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_gather(int, void*, int, MPI_Datatype, void*, int, MPI_Datatype, int, MPI_Comm,
                   MPI_Info, MPI_Request*)
    int mcr_gatherv(int, void*, int, MPI_Datatype, void*, int*, int*, MPI_Datatype, int,
                    MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_scatter(int, void*, int, MPI_Datatype, void*, int, MPI_Datatype, int, MPI_Comm,
                    MPI_Info, MPI_Request*)
    int mcr_scatterv(int, void*, int*, int*, MPI_Datatype, void*, int, MPI_Datatype, int,
                     MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_allgather(int, void*, int, MPI_Datatype, void*, int, MPI_Datatype, MPI_Comm,
                      MPI_Info, MPI_Request*)
    int mcr_allgatherv(int, void*, int, MPI_Datatype, void*, int*, int*, MPI_Datatype,
                       MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_alltoall(int, void*, int, MPI_Datatype, void*, int, MPI_Datatype, MPI_Comm,
                     MPI_Info, MPI_Request*)
    int mcr_alltoallv(int, void*, int*, int*, MPI_Datatype, void*, int*, int*, MPI_Datatype,
                      MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_alltoallw(int, void*, int*, int*, MPI_Datatype*, void*, int*, int*, MPI_Datatype*,
                      MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_reduce(int, void*, void*, int, MPI_Datatype, MPI_Op, int, MPI_Comm, MPI_Info,
                   MPI_Request*)
    int mcr_allreduce(int, void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Info,
                      MPI_Request*)
    int mcr_reduce_scatter_block(int, void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm,
                                 MPI_Info, MPI_Request*)
    int mcr_reduce_scatter(int, void*, void*, int*, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Info,
                           MPI_Request*)
    int mcr_scan(int, void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Info,
                 MPI_Request*)
    int mcr_exscan(int, void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm, MPI_Info,
                   MPI_Request*)
    int mcr_neighbor_allgather(int, void*, int, MPI_Datatype, void*, int, MPI_Datatype,
                               MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_neighbor_allgatherv(int, void*, int, MPI_Datatype, void*, int*, int*,
                                MPI_Datatype, MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_neighbor_alltoall(int, void*, int, MPI_Datatype, void*, int, MPI_Datatype,
                              MPI_Comm, MPI_Info, MPI_Request*)
    int mcr_neighbor_alltoallv(int, void*, int*, int*, MPI_Datatype, void*, int*, int*,
                               MPI_Datatype, MPI_Comm, MPI_Info, MPI_Request*)
