/* One entry point per MPI operation for its three forms.
 *
 * mode MCR_BLOCKING calls MPI_X, MCR_NONBLOCKING MPI_IX (into *req) and
 * MCR_PERSISTENT MPI_X_init (into *req); mcr checks the arguments before
 * (src/mcr/core/ops.pxi). The persistent collectives are MPI-4;
 * Open MPI 5 declares them although it reports MPI 3.1. Where the library
 * lacks them, the persistent form returns MCR_ERR_NO_PERSISTENT and mcr
 * emulates it with the non-blocking form.
 */
#ifndef MCR_DISPATCH_H
#define MCR_DISPATCH_H

#include <mpi.h>

enum { MCR_BLOCKING = 0, MCR_NONBLOCKING = 1, MCR_PERSISTENT = 2 };
#define MCR_ERR_NO_PERSISTENT (-1)

#if (MPI_VERSION >= 4) || (defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5)
#define MCR_HAVE_PERSISTENT_COLL 1
#define MCR_PCOLL(call) return (call)
#else
#define MCR_HAVE_PERSISTENT_COLL 0
#define MCR_PCOLL(call) return MCR_ERR_NO_PERSISTENT
#endif

#define MCR_THREE_FORMS(blocking, nonblocking, persistent) \
  switch (mode) {                                          \
  case MCR_BLOCKING: return (blocking);                    \
  case MCR_NONBLOCKING: return (nonblocking);              \
  default: persistent;                                     \
  }

/* -- Point-to-point ------------------------------------------------------ */

static inline int mcr_send(int mode, const void *b, int n, MPI_Datatype t, int dest, int tag,
                           MPI_Comm c, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Send(b, n, t, dest, tag, c), MPI_Isend(b, n, t, dest, tag, c, req),
                  return MPI_Send_init(b, n, t, dest, tag, c, req))
}

static inline int mcr_recv(int mode, void *b, int n, MPI_Datatype t, int source, int tag,
                           MPI_Comm c, MPI_Status *st, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Recv(b, n, t, source, tag, c, st),
                  MPI_Irecv(b, n, t, source, tag, c, req),
                  return MPI_Recv_init(b, n, t, source, tag, c, req))
}

/* The send modes: standard (MPI_Send), buffered (MPI_Bsend, into the buffer
 * attached with MPI_Buffer_attach), synchronous (MPI_Ssend: completes once the
 * receive has started) and ready (MPI_Rsend: the receive must be posted). */
enum { MCR_STANDARD = 0, MCR_BUFFERED = 1, MCR_SYNCHRONOUS = 2, MCR_READY = 3 };

static inline int mcr_bsend(int mode, const void *b, int n, MPI_Datatype t, int dest, int tag,
                            MPI_Comm c, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Bsend(b, n, t, dest, tag, c), MPI_Ibsend(b, n, t, dest, tag, c, req),
                  return MPI_Bsend_init(b, n, t, dest, tag, c, req))
}

static inline int mcr_ssend(int mode, const void *b, int n, MPI_Datatype t, int dest, int tag,
                            MPI_Comm c, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Ssend(b, n, t, dest, tag, c), MPI_Issend(b, n, t, dest, tag, c, req),
                  return MPI_Ssend_init(b, n, t, dest, tag, c, req))
}

static inline int mcr_rsend(int mode, const void *b, int n, MPI_Datatype t, int dest, int tag,
                            MPI_Comm c, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Rsend(b, n, t, dest, tag, c), MPI_Irsend(b, n, t, dest, tag, c, req),
                  return MPI_Rsend_init(b, n, t, dest, tag, c, req))
}

static inline int mcr_send_in(int send_mode, int mode, const void *b, int n, MPI_Datatype t,
                              int dest, int tag, MPI_Comm c, MPI_Request *req)
{
  switch (send_mode) {
  case MCR_BUFFERED: return mcr_bsend(mode, b, n, t, dest, tag, c, req);
  case MCR_SYNCHRONOUS: return mcr_ssend(mode, b, n, t, dest, tag, c, req);
  case MCR_READY: return mcr_rsend(mode, b, n, t, dest, tag, c, req);
  default: return mcr_send(mode, b, n, t, dest, tag, c, req);
  }
}

/* Sendrecv(_replace) blocking and non-blocking; there is no persistent form.
 * MPI_Isendrecv and MPI_Isendrecv_replace are MPI-4 (MPICH 4; Open MPI 5
 * declares them although it reports MPI 3.1): without them the non-blocking
 * form returns MCR_ERR_NO_ISENDRECV. */
#define MCR_ERR_NO_ISENDRECV (-2)
#if (MPI_VERSION >= 4) || (defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5)
#define MCR_HAVE_ISENDRECV 1
#define MCR_ISENDRECV(call) return (call)
#else
#define MCR_HAVE_ISENDRECV 0
#define MCR_ISENDRECV(call) return MCR_ERR_NO_ISENDRECV
#endif

static inline int mcr_sendrecv(int mode, const void *s, int sn, MPI_Datatype st, int dest,
                               int sendtag, void *r, int rn, MPI_Datatype rt, int source,
                               int recvtag, MPI_Comm c, MPI_Status *status, MPI_Request *req)
{
  switch (mode) {
  case MCR_BLOCKING:
    return MPI_Sendrecv(s, sn, st, dest, sendtag, r, rn, rt, source, recvtag, c, status);
  default:
    MCR_ISENDRECV(MPI_Isendrecv(s, sn, st, dest, sendtag, r, rn, rt, source, recvtag, c,
                                req));
  }
}

static inline int mcr_sendrecv_replace(int mode, void *b, int n, MPI_Datatype t, int dest,
                                       int sendtag, int source, int recvtag, MPI_Comm c,
                                       MPI_Status *status, MPI_Request *req)
{
  switch (mode) {
  case MCR_BLOCKING:
    return MPI_Sendrecv_replace(b, n, t, dest, sendtag, source, recvtag, c, status);
  default:
    MCR_ISENDRECV(MPI_Isendrecv_replace(b, n, t, dest, sendtag, source, recvtag, c, req));
  }
}

/* -- Collectives --------------------------------------------------------- */

static inline int mcr_barrier(int mode, MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Barrier(c), MPI_Ibarrier(c, req), MCR_PCOLL(MPI_Barrier_init(c, info, req)))
}

static inline int mcr_bcast(int mode, void *b, int n, MPI_Datatype t, int root, MPI_Comm c,
                            MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Bcast(b, n, t, root, c), MPI_Ibcast(b, n, t, root, c, req),
                  MCR_PCOLL(MPI_Bcast_init(b, n, t, root, c, info, req)))
}

static inline int mcr_gather(int mode, const void *s, int sn, MPI_Datatype st, void *r, int rn,
                             MPI_Datatype rt, int root, MPI_Comm c, MPI_Info info,
                             MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Gather(s, sn, st, r, rn, rt, root, c),
                  MPI_Igather(s, sn, st, r, rn, rt, root, c, req),
                  MCR_PCOLL(MPI_Gather_init(s, sn, st, r, rn, rt, root, c, info, req)))
}

static inline int mcr_gatherv(int mode, const void *s, int sn, MPI_Datatype st, void *r,
                              const int *rns, const int *rds, MPI_Datatype rt, int root,
                              MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Gatherv(s, sn, st, r, rns, rds, rt, root, c),
                  MPI_Igatherv(s, sn, st, r, rns, rds, rt, root, c, req),
                  MCR_PCOLL(MPI_Gatherv_init(s, sn, st, r, rns, rds, rt, root, c, info, req)))
}

static inline int mcr_scatter(int mode, const void *s, int sn, MPI_Datatype st, void *r, int rn,
                              MPI_Datatype rt, int root, MPI_Comm c, MPI_Info info,
                              MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Scatter(s, sn, st, r, rn, rt, root, c),
                  MPI_Iscatter(s, sn, st, r, rn, rt, root, c, req),
                  MCR_PCOLL(MPI_Scatter_init(s, sn, st, r, rn, rt, root, c, info, req)))
}

static inline int mcr_scatterv(int mode, const void *s, const int *sns, const int *sds,
                               MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root,
                               MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Scatterv(s, sns, sds, st, r, rn, rt, root, c),
                  MPI_Iscatterv(s, sns, sds, st, r, rn, rt, root, c, req),
                  MCR_PCOLL(MPI_Scatterv_init(s, sns, sds, st, r, rn, rt, root, c, info, req)))
}

static inline int mcr_allgather(int mode, const void *s, int sn, MPI_Datatype st, void *r,
                                int rn, MPI_Datatype rt, MPI_Comm c, MPI_Info info,
                                MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Allgather(s, sn, st, r, rn, rt, c),
                  MPI_Iallgather(s, sn, st, r, rn, rt, c, req),
                  MCR_PCOLL(MPI_Allgather_init(s, sn, st, r, rn, rt, c, info, req)))
}

static inline int mcr_allgatherv(int mode, const void *s, int sn, MPI_Datatype st, void *r,
                                 const int *rns, const int *rds, MPI_Datatype rt, MPI_Comm c,
                                 MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Allgatherv(s, sn, st, r, rns, rds, rt, c),
                  MPI_Iallgatherv(s, sn, st, r, rns, rds, rt, c, req),
                  MCR_PCOLL(MPI_Allgatherv_init(s, sn, st, r, rns, rds, rt, c, info, req)))
}

static inline int mcr_alltoall(int mode, const void *s, int sn, MPI_Datatype st, void *r,
                               int rn, MPI_Datatype rt, MPI_Comm c, MPI_Info info,
                               MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Alltoall(s, sn, st, r, rn, rt, c),
                  MPI_Ialltoall(s, sn, st, r, rn, rt, c, req),
                  MCR_PCOLL(MPI_Alltoall_init(s, sn, st, r, rn, rt, c, info, req)))
}

static inline int mcr_alltoallv(int mode, const void *s, const int *sns, const int *sds,
                                MPI_Datatype st, void *r, const int *rns, const int *rds,
                                MPI_Datatype rt, MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Alltoallv(s, sns, sds, st, r, rns, rds, rt, c),
                  MPI_Ialltoallv(s, sns, sds, st, r, rns, rds, rt, c, req),
                  MCR_PCOLL(MPI_Alltoallv_init(s, sns, sds, st, r, rns, rds, rt, c, info, req)))
}

static inline int mcr_alltoallw(int mode, const void *s, const int *sns, const int *sds,
                                const MPI_Datatype *sts, void *r, const int *rns,
                                const int *rds, const MPI_Datatype *rts, MPI_Comm c,
                                MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Alltoallw(s, sns, sds, sts, r, rns, rds, rts, c),
                  MPI_Ialltoallw(s, sns, sds, sts, r, rns, rds, rts, c, req),
                  MCR_PCOLL(MPI_Alltoallw_init(s, sns, sds, sts, r, rns, rds, rts, c, info,
                                               req)))
}

static inline int mcr_reduce(int mode, const void *s, void *r, int n, MPI_Datatype t, MPI_Op op,
                             int root, MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Reduce(s, r, n, t, op, root, c),
                  MPI_Ireduce(s, r, n, t, op, root, c, req),
                  MCR_PCOLL(MPI_Reduce_init(s, r, n, t, op, root, c, info, req)))
}

static inline int mcr_allreduce(int mode, const void *s, void *r, int n, MPI_Datatype t,
                                MPI_Op op, MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Allreduce(s, r, n, t, op, c), MPI_Iallreduce(s, r, n, t, op, c, req),
                  MCR_PCOLL(MPI_Allreduce_init(s, r, n, t, op, c, info, req)))
}

static inline int mcr_reduce_scatter_block(int mode, const void *s, void *r, int n,
                                           MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                           MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Reduce_scatter_block(s, r, n, t, op, c),
                  MPI_Ireduce_scatter_block(s, r, n, t, op, c, req),
                  MCR_PCOLL(MPI_Reduce_scatter_block_init(s, r, n, t, op, c, info, req)))
}

static inline int mcr_reduce_scatter(int mode, const void *s, void *r, const int *ns,
                                     MPI_Datatype t, MPI_Op op, MPI_Comm c, MPI_Info info,
                                     MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Reduce_scatter(s, r, ns, t, op, c),
                  MPI_Ireduce_scatter(s, r, ns, t, op, c, req),
                  MCR_PCOLL(MPI_Reduce_scatter_init(s, r, ns, t, op, c, info, req)))
}

static inline int mcr_scan(int mode, const void *s, void *r, int n, MPI_Datatype t, MPI_Op op,
                           MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Scan(s, r, n, t, op, c), MPI_Iscan(s, r, n, t, op, c, req),
                  MCR_PCOLL(MPI_Scan_init(s, r, n, t, op, c, info, req)))
}

static inline int mcr_exscan(int mode, const void *s, void *r, int n, MPI_Datatype t, MPI_Op op,
                             MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Exscan(s, r, n, t, op, c), MPI_Iexscan(s, r, n, t, op, c, req),
                  MCR_PCOLL(MPI_Exscan_init(s, r, n, t, op, c, info, req)))
}

/* -- Neighborhood collectives (topologies: src/mcr/core/neighbor.pxi) ---- */

static inline int mcr_neighbor_allgather(int mode, const void *s, int sn, MPI_Datatype st,
                                         void *r, int rn, MPI_Datatype rt, MPI_Comm c,
                                         MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Neighbor_allgather(s, sn, st, r, rn, rt, c),
                  MPI_Ineighbor_allgather(s, sn, st, r, rn, rt, c, req),
                  MCR_PCOLL(MPI_Neighbor_allgather_init(s, sn, st, r, rn, rt, c, info, req)))
}

static inline int mcr_neighbor_allgatherv(int mode, const void *s, int sn, MPI_Datatype st,
                                          void *r, const int *rns, const int *rds,
                                          MPI_Datatype rt, MPI_Comm c, MPI_Info info,
                                          MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Neighbor_allgatherv(s, sn, st, r, rns, rds, rt, c),
                  MPI_Ineighbor_allgatherv(s, sn, st, r, rns, rds, rt, c, req),
                  MCR_PCOLL(MPI_Neighbor_allgatherv_init(s, sn, st, r, rns, rds, rt, c, info,
                                                         req)))
}

static inline int mcr_neighbor_alltoall(int mode, const void *s, int sn, MPI_Datatype st,
                                        void *r, int rn, MPI_Datatype rt, MPI_Comm c,
                                        MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Neighbor_alltoall(s, sn, st, r, rn, rt, c),
                  MPI_Ineighbor_alltoall(s, sn, st, r, rn, rt, c, req),
                  MCR_PCOLL(MPI_Neighbor_alltoall_init(s, sn, st, r, rn, rt, c, info, req)))
}

static inline int mcr_neighbor_alltoallv(int mode, const void *s, const int *sns,
                                         const int *sds, MPI_Datatype st, void *r,
                                         const int *rns, const int *rds, MPI_Datatype rt,
                                         MPI_Comm c, MPI_Info info, MPI_Request *req)
{
  MCR_THREE_FORMS(MPI_Neighbor_alltoallv(s, sns, sds, st, r, rns, rds, rt, c),
                  MPI_Ineighbor_alltoallv(s, sns, sds, st, r, rns, rds, rt, c, req),
                  MCR_PCOLL(MPI_Neighbor_alltoallv_init(s, sns, sds, st, r, rns, rds, rt, c,
                                                        info, req)))
}

#endif /* MCR_DISPATCH_H */
