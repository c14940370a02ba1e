/*
 * osu_c.c - the raw-MPI reference of `python -m mcr.bench compare`.
 *
 * Times every MPI collective and a ping-pong the way the OSU Micro-Benchmarks
 * do: warm-up calls, an MPI_Barrier, then a loop of back-to-back calls timed
 * with MPI_Wtime; this rank's mean per call is averaged over all ranks (OSU's
 * "Avg Latency(us)"). The same loop runs --rounds times and every round is
 * reported, because timings on small shared machines are noisy. The Python
 * peers in mcr/bench/compare.py time their loops in exactly this manner.
 *
 * Each operation runs once before timing with known data, and the result is
 * checked on every rank ("ok" in the output).
 *
 * Message sizes are bytes of one message, as OSU counts them: the buffer of
 * bcast, reduce, allreduce, scan and exscan; the block one rank sends to (or
 * receives from) one rank in gather(v), scatter(v), allgather(v) and
 * alltoall(v); the reduced vector of reduce_scatter, split as OSU splits it
 * (count / P each, the first count % P ranks one more); blocks of
 * max(1, count / P) elements in reduce_scatter_block; one message of the
 * ping-pong "latency", whose time is half a round trip between ranks 0 and 1
 * (other ranks idle). These are the sizes of mcr/bench/ops.py. Vector ("v")
 * collectives use equal counts. Roots are rank 0; the reduction is MPI_SUM.
 *
 * Forms: blocking (MPI_Allreduce), nonblocking (MPI_Iallreduce + MPI_Wait) and
 * persistent (MPI_Allreduce_init once, then MPI_Start + MPI_Wait per call;
 * MPI-4, which Open MPI 5 provides although it reports MPI 3.1).
 *
 * Build:  mpicc -O2 -o osu_c osu_c.c
 * Usage:  mpiexec -n 2 ./osu_c [-o op,...] [-f form,...] [-d dtype] [-i iters]
 *                              [-w warmup] [-I iters_large] [-W warmup_large]
 *                              [-L large_bytes] [-r rounds] [-t] [bytes ...]
 *   -o  operations (default allreduce): barrier bcast gather gatherv scatter
 *       scatterv allgather allgatherv alltoall alltoallv reduce allreduce
 *       reduce_scatter reduce_scatter_block scan exscan latency
 *   -f  forms (default blocking): blocking nonblocking persistent
 *   -d  element type (default float32): float32 float64 int8 uint8 int16
 *       int32 int64
 *   -i, -w  timed and warm-up calls per round up to -L bytes (default 1000, 100)
 *   -I, -W  the same above -L bytes (default 100, 10; OSU uses 8192 for -L)
 *   -r  rounds (default 1)
 *   -t  initialize with MPI_THREAD_MULTIPLE (the level mpi4py asks for)
 *   bytes   message sizes (default 4); sizes under one element are skipped
 *
 * Output: one JSON object per line and (operation, form, size):
 *   {"op": "allreduce", "form": "blocking", "bytes": 4, "count": 1,
 *    "iters": 1000, "warmup": 100, "ok": true, "error": "",
 *    "rounds_us": [0.41, ...]}
 * and "supported": false instead of rounds_us where the form is missing.
 */

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if MPI_VERSION >= 4 || (defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5)
#define HAVE_PERSISTENT_COLLECTIVES 1
#else
#define HAVE_PERSISTENT_COLLECTIVES 0
#endif

enum form { BLOCKING, NONBLOCKING, PERSISTENT };
static const char *form_names[] = {"blocking", "nonblocking", "persistent"};

enum op {
    BARRIER, BCAST, GATHER, GATHERV, SCATTER, SCATTERV, ALLGATHER, ALLGATHERV,
    ALLTOALL, ALLTOALLV, REDUCE, ALLREDUCE, REDUCE_SCATTER, REDUCE_SCATTER_BLOCK,
    SCAN, EXSCAN, LATENCY, NOPS
};
static const char *op_names[] = {
    "barrier", "bcast", "gather", "gatherv", "scatter", "scatterv", "allgather",
    "allgatherv", "alltoall", "alltoallv", "reduce", "allreduce", "reduce_scatter",
    "reduce_scatter_block", "scan", "exscan", "latency"
};

struct dtype {
    const char *name;
    MPI_Datatype type;
    int size;
};

/* Everything one operation needs: buffers, counts and the persistent request. */
struct bench {
    enum op op;
    int n;                 /* elements per message (see the header) */
    int blk;               /* reduce_scatter_block: elements per rank */
    int rank, size;
    struct dtype dt;
    void *sbuf, *rbuf;
    int *counts, *displs;  /* per rank: n each (reduce_scatter: its split) */
    MPI_Request req[2];
    int nreq;
};

/* ------------------------------------------------------------------------ */
/* Element access: the check data are small integers, exact in every type.  */
/* ------------------------------------------------------------------------ */

static void put(const struct bench *b, void *buf, size_t i, int v)
{
    MPI_Datatype t = b->dt.type;
    if (t == MPI_FLOAT) ((float *)buf)[i] = (float)v;
    else if (t == MPI_DOUBLE) ((double *)buf)[i] = (double)v;
    else if (t == MPI_INT8_T) ((int8_t *)buf)[i] = (int8_t)v;
    else if (t == MPI_UINT8_T) ((uint8_t *)buf)[i] = (uint8_t)v;
    else if (t == MPI_INT16_T) ((int16_t *)buf)[i] = (int16_t)v;
    else if (t == MPI_INT32_T) ((int32_t *)buf)[i] = (int32_t)v;
    else ((int64_t *)buf)[i] = (int64_t)v;
}

static long get(const struct bench *b, const void *buf, size_t i)
{
    MPI_Datatype t = b->dt.type;
    if (t == MPI_FLOAT) return (long)((const float *)buf)[i];
    if (t == MPI_DOUBLE) return (long)((const double *)buf)[i];
    if (t == MPI_INT8_T) return ((const int8_t *)buf)[i];
    if (t == MPI_UINT8_T) return ((const uint8_t *)buf)[i];
    if (t == MPI_INT16_T) return ((const int16_t *)buf)[i];
    if (t == MPI_INT32_T) return ((const int32_t *)buf)[i];
    return (long)((const int64_t *)buf)[i];
}

/* What rank `from` sends to rank `to` at element i: 1..4, so that sums over
 * up to 31 ranks stay exact even in int8. */
static int value(int from, int to, size_t i)
{
    return (int)((3 * (size_t)from + 5 * (size_t)to + i) % 4) + 1;
}

/* Elements in the send and receive buffers of an operation. */
static void buffer_sizes(const struct bench *b, size_t *ns, size_t *nr)
{
    size_t n = (size_t)b->n, p = (size_t)b->size;
    switch (b->op) {
    case GATHER: case GATHERV: case ALLGATHER: case ALLGATHERV:
        *ns = n; *nr = n * p; break;
    case SCATTER: case SCATTERV:
        *ns = n * p; *nr = n; break;
    case ALLTOALL: case ALLTOALLV:
        *ns = n * p; *nr = n * p; break;
    case REDUCE_SCATTER:
        *ns = n; *nr = (size_t)b->counts[b->rank]; break;
    case REDUCE_SCATTER_BLOCK:
        *ns = (size_t)b->blk * p; *nr = (size_t)b->blk; break;
    case BARRIER:
        *ns = 1; *nr = 1; break;
    default:
        *ns = n; *nr = n; break;
    }
}

/* Fill the send buffer with the check data and clear the receive buffer. */
static void fill(struct bench *b)
{
    size_t ns, nr, i, n = (size_t)b->n;
    int r = b->rank, d;

    buffer_sizes(b, &ns, &nr);
    memset(b->rbuf, 0, nr * b->dt.size);
    switch (b->op) {
    case SCATTER: case SCATTERV: case ALLTOALL: case ALLTOALLV:
        for (d = 0; d < b->size; d++)
            for (i = 0; i < n; i++)
                put(b, b->sbuf, (size_t)d * n + i, value(r, d, i));
        break;
    case BCAST:
        /* the buffer is both: the root's data, zeros elsewhere */
        for (i = 0; i < n; i++)
            put(b, b->sbuf, i, r == 0 ? value(0, 0, i) : 0);
        break;
    default:
        for (i = 0; i < ns; i++)
            put(b, b->sbuf, i, value(r, 0, i));
        break;
    }
}

/* Check the result of one call made after fill(); returns 0 or writes why. */
static int check(const struct bench *b, char *why, size_t len)
{
    size_t i, n = (size_t)b->n, ns, nr, start;
    int r = b->rank, p = b->size, s, k;
    long got = 0, want = 0;

#define EXPECT(buf, idx, w)                                                 \
    do {                                                                    \
        got = get(b, (buf), (idx)); want = (w);                             \
        if (got != want) {                                                  \
            snprintf(why, len, "%s: rank %d element %zu is %ld, expected %ld", \
                     op_names[b->op], r, (size_t)(idx), got, want);         \
            return 1;                                                       \
        }                                                                   \
    } while (0)

    if (b->op == REDUCE_SCATTER || b->op == REDUCE_SCATTER_BLOCK) {
        /* rank r holds its part of the sum of the send vectors */
        buffer_sizes(b, &ns, &nr);
        start = b->op == REDUCE_SCATTER ? (size_t)b->displs[r] : (size_t)r * b->blk;
        for (i = 0; i < nr; i++) {
            want = 0;
            for (s = 0; s < p; s++) want += value(s, 0, start + i);
            EXPECT(b->rbuf, i, want);
        }
        return 0;
    }
    for (i = 0; i < n; i++) {
        switch (b->op) {
        case BCAST:
            EXPECT(b->sbuf, i, value(0, 0, i)); break;
        case GATHER: case GATHERV:
            if (r == 0)
                for (s = 0; s < p; s++) EXPECT(b->rbuf, (size_t)s * n + i, value(s, 0, i));
            break;
        case ALLGATHER: case ALLGATHERV:
            for (s = 0; s < p; s++) EXPECT(b->rbuf, (size_t)s * n + i, value(s, 0, i));
            break;
        case SCATTER: case SCATTERV:
            EXPECT(b->rbuf, i, value(0, r, i)); break;
        case ALLTOALL: case ALLTOALLV:
            for (s = 0; s < p; s++) EXPECT(b->rbuf, (size_t)s * n + i, value(s, r, i));
            break;
        case REDUCE: case ALLREDUCE: case SCAN: case EXSCAN:
            if (b->op == REDUCE && r != 0) break;
            if (b->op == EXSCAN && r == 0) break;   /* undefined on rank 0 */
            want = 0;
            k = b->op == SCAN ? r + 1 : b->op == EXSCAN ? r : p;
            for (s = 0; s < k; s++) want += value(s, 0, i);
            EXPECT(b->rbuf, i, want);
            break;
        case LATENCY:
            if (r == 0) EXPECT(b->rbuf, i, value(1, 0, i));
            if (r == 1) EXPECT(b->rbuf, i, value(0, 0, i));
            break;
        default:
            break;
        }
    }
#undef EXPECT
    return 0;
}

/* ------------------------------------------------------------------------ */
/* One call of an operation in each form.                                   */
/* ------------------------------------------------------------------------ */

/* The blocking call, or with `req` the nonblocking one (persistent: `init`). */
static int call(struct bench *b, enum form f)
{
    MPI_Comm c = MPI_COMM_WORLD;
    MPI_Datatype t = b->dt.type;
    void *s = b->sbuf, *r = b->rbuf;
    int n = b->n, *cn = b->counts, *dp = b->displs, err = MPI_SUCCESS;
    MPI_Request *q = &b->req[0];

    if (b->op == LATENCY) {
        /* rank 0 sends then receives, rank 1 the other way round */
        int peer = 1 - b->rank;
        if (b->rank > 1) return MPI_SUCCESS;
        if (f == BLOCKING) {
            if (b->rank == 0) {
                err = MPI_Send(s, n, t, peer, 1, c);
                if (!err) err = MPI_Recv(r, n, t, peer, 1, c, MPI_STATUS_IGNORE);
            } else {
                err = MPI_Recv(r, n, t, peer, 1, c, MPI_STATUS_IGNORE);
                if (!err) err = MPI_Send(s, n, t, peer, 1, c);
            }
            return err;
        }
        if (f == NONBLOCKING) {
            if (b->rank == 0) {
                err = MPI_Isend(s, n, t, peer, 1, c, &b->req[0]);
                if (!err) err = MPI_Wait(&b->req[0], MPI_STATUS_IGNORE);
                if (!err) err = MPI_Irecv(r, n, t, peer, 1, c, &b->req[1]);
                if (!err) err = MPI_Wait(&b->req[1], MPI_STATUS_IGNORE);
            } else {
                err = MPI_Irecv(r, n, t, peer, 1, c, &b->req[1]);
                if (!err) err = MPI_Wait(&b->req[1], MPI_STATUS_IGNORE);
                if (!err) err = MPI_Isend(s, n, t, peer, 1, c, &b->req[0]);
                if (!err) err = MPI_Wait(&b->req[0], MPI_STATUS_IGNORE);
            }
            return err;
        }
        /* persistent: requests made by make_persistent() */
        if (b->rank == 0) {
            err = MPI_Start(&b->req[0]);
            if (!err) err = MPI_Wait(&b->req[0], MPI_STATUS_IGNORE);
            if (!err) err = MPI_Start(&b->req[1]);
            if (!err) err = MPI_Wait(&b->req[1], MPI_STATUS_IGNORE);
        } else {
            err = MPI_Start(&b->req[1]);
            if (!err) err = MPI_Wait(&b->req[1], MPI_STATUS_IGNORE);
            if (!err) err = MPI_Start(&b->req[0]);
            if (!err) err = MPI_Wait(&b->req[0], MPI_STATUS_IGNORE);
        }
        return err;
    }

    if (f == PERSISTENT) {
        err = MPI_Start(q);
        return err ? err : MPI_Wait(q, MPI_STATUS_IGNORE);
    }
    if (f == BLOCKING) {
        switch (b->op) {
        case BARRIER: return MPI_Barrier(c);
        case BCAST: return MPI_Bcast(s, n, t, 0, c);
        case GATHER: return MPI_Gather(s, n, t, r, n, t, 0, c);
        case GATHERV: return MPI_Gatherv(s, n, t, r, cn, dp, t, 0, c);
        case SCATTER: return MPI_Scatter(s, n, t, r, n, t, 0, c);
        case SCATTERV: return MPI_Scatterv(s, cn, dp, t, r, n, t, 0, c);
        case ALLGATHER: return MPI_Allgather(s, n, t, r, n, t, c);
        case ALLGATHERV: return MPI_Allgatherv(s, n, t, r, cn, dp, t, c);
        case ALLTOALL: return MPI_Alltoall(s, n, t, r, n, t, c);
        case ALLTOALLV: return MPI_Alltoallv(s, cn, dp, t, r, cn, dp, t, c);
        case REDUCE: return MPI_Reduce(s, r, n, t, MPI_SUM, 0, c);
        case ALLREDUCE: return MPI_Allreduce(s, r, n, t, MPI_SUM, c);
        case REDUCE_SCATTER: return MPI_Reduce_scatter(s, r, cn, t, MPI_SUM, c);
        case REDUCE_SCATTER_BLOCK:
            return MPI_Reduce_scatter_block(s, r, b->blk, t, MPI_SUM, c);
        case SCAN: return MPI_Scan(s, r, n, t, MPI_SUM, c);
        case EXSCAN: return MPI_Exscan(s, r, n, t, MPI_SUM, c);
        default: return MPI_ERR_OTHER;
        }
    }
    switch (b->op) {
    case BARRIER: err = MPI_Ibarrier(c, q); break;
    case BCAST: err = MPI_Ibcast(s, n, t, 0, c, q); break;
    case GATHER: err = MPI_Igather(s, n, t, r, n, t, 0, c, q); break;
    case GATHERV: err = MPI_Igatherv(s, n, t, r, cn, dp, t, 0, c, q); break;
    case SCATTER: err = MPI_Iscatter(s, n, t, r, n, t, 0, c, q); break;
    case SCATTERV: err = MPI_Iscatterv(s, cn, dp, t, r, n, t, 0, c, q); break;
    case ALLGATHER: err = MPI_Iallgather(s, n, t, r, n, t, c, q); break;
    case ALLGATHERV: err = MPI_Iallgatherv(s, n, t, r, cn, dp, t, c, q); break;
    case ALLTOALL: err = MPI_Ialltoall(s, n, t, r, n, t, c, q); break;
    case ALLTOALLV: err = MPI_Ialltoallv(s, cn, dp, t, r, cn, dp, t, c, q); break;
    case REDUCE: err = MPI_Ireduce(s, r, n, t, MPI_SUM, 0, c, q); break;
    case ALLREDUCE: err = MPI_Iallreduce(s, r, n, t, MPI_SUM, c, q); break;
    case REDUCE_SCATTER: err = MPI_Ireduce_scatter(s, r, cn, t, MPI_SUM, c, q); break;
    case REDUCE_SCATTER_BLOCK:
        err = MPI_Ireduce_scatter_block(s, r, b->blk, t, MPI_SUM, c, q); break;
    case SCAN: err = MPI_Iscan(s, r, n, t, MPI_SUM, c, q); break;
    case EXSCAN: err = MPI_Iexscan(s, r, n, t, MPI_SUM, c, q); break;
    default: return MPI_ERR_OTHER;
    }
    return err ? err : MPI_Wait(q, MPI_STATUS_IGNORE);
}

/* Create the persistent request(s); MPI_ERR_UNSUPPORTED_OPERATION without MPI-4. */
static int make_persistent(struct bench *b)
{
    MPI_Comm c = MPI_COMM_WORLD;
    MPI_Datatype t = b->dt.type;
    void *s = b->sbuf, *r = b->rbuf;
    int n = b->n, *cn = b->counts, *dp = b->displs;
    MPI_Info i = MPI_INFO_NULL;
    MPI_Request *q = &b->req[0];

    b->nreq = 1;
    if (b->op == LATENCY) {
        b->nreq = 2;
        if (b->rank > 1) {
            b->req[0] = b->req[1] = MPI_REQUEST_NULL;
            return MPI_SUCCESS;
        }
        int err = MPI_Send_init(s, n, t, 1 - b->rank, 1, c, &b->req[0]);
        return err ? err : MPI_Recv_init(r, n, t, 1 - b->rank, 1, c, &b->req[1]);
    }
#if HAVE_PERSISTENT_COLLECTIVES
    switch (b->op) {
    case BARRIER: return MPI_Barrier_init(c, i, q);
    case BCAST: return MPI_Bcast_init(s, n, t, 0, c, i, q);
    case GATHER: return MPI_Gather_init(s, n, t, r, n, t, 0, c, i, q);
    case GATHERV: return MPI_Gatherv_init(s, n, t, r, cn, dp, t, 0, c, i, q);
    case SCATTER: return MPI_Scatter_init(s, n, t, r, n, t, 0, c, i, q);
    case SCATTERV: return MPI_Scatterv_init(s, cn, dp, t, r, n, t, 0, c, i, q);
    case ALLGATHER: return MPI_Allgather_init(s, n, t, r, n, t, c, i, q);
    case ALLGATHERV: return MPI_Allgatherv_init(s, n, t, r, cn, dp, t, c, i, q);
    case ALLTOALL: return MPI_Alltoall_init(s, n, t, r, n, t, c, i, q);
    case ALLTOALLV: return MPI_Alltoallv_init(s, cn, dp, t, r, cn, dp, t, c, i, q);
    case REDUCE: return MPI_Reduce_init(s, r, n, t, MPI_SUM, 0, c, i, q);
    case ALLREDUCE: return MPI_Allreduce_init(s, r, n, t, MPI_SUM, c, i, q);
    case REDUCE_SCATTER: return MPI_Reduce_scatter_init(s, r, cn, t, MPI_SUM, c, i, q);
    case REDUCE_SCATTER_BLOCK:
        return MPI_Reduce_scatter_block_init(s, r, b->blk, t, MPI_SUM, c, i, q);
    case SCAN: return MPI_Scan_init(s, r, n, t, MPI_SUM, c, i, q);
    case EXSCAN: return MPI_Exscan_init(s, r, n, t, MPI_SUM, c, i, q);
    default: break;
    }
#else
    (void)c; (void)t; (void)s; (void)r; (void)n; (void)cn; (void)dp; (void)i; (void)q;
#endif
    return MPI_ERR_UNSUPPORTED_OPERATION;
}

static void free_persistent(struct bench *b)
{
    int k;
    for (k = 0; k < b->nreq; k++)
        if (b->req[k] != MPI_REQUEST_NULL)
            MPI_Request_free(&b->req[k]);
    b->nreq = 0;
}

/* ------------------------------------------------------------------------ */
/* Driver                                                                   */
/* ------------------------------------------------------------------------ */

static int lookup(const char *name, const char **names, int n)
{
    int k;
    for (k = 0; k < n; k++)
        if (strcmp(name, names[k]) == 0) return k;
    return -1;
}

/* Parse a comma-separated list of names into flags; -1 on an unknown name. */
static int parse_list(const char *arg, const char **names, int n, int *flags)
{
    char *copy = strdup(arg), *tok, *save = NULL;
    int k;
    memset(flags, 0, sizeof(int) * n);
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        k = lookup(tok, names, n);
        if (k < 0) {
            fprintf(stderr, "osu_c: unknown name %s\n", tok);
            free(copy);
            return -1;
        }
        flags[k] = 1;
    }
    free(copy);
    return 0;
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        putchar(*s == '\n' ? ' ' : *s);
    }
    putchar('"');
}

/* Every rank's verdict on rank 0: the first error message, or "". */
static void agree(const struct bench *b, int bad, char *why, size_t len)
{
    int any = 0, first = -1, cand = bad ? b->rank : b->size;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!any) { why[0] = 0; return; }
    MPI_Allreduce(&cand, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first != 0) {
        if (b->rank == first) MPI_Send(why, (int)len, MPI_CHAR, 0, 7, MPI_COMM_WORLD);
        if (b->rank == 0) MPI_Recv(why, (int)len, MPI_CHAR, first, 7, MPI_COMM_WORLD,
                                   MPI_STATUS_IGNORE);
    }
}

static const char *mpi_error(int err, char *buf)
{
    int len = 0;
    MPI_Error_string(err, buf, &len);
    return buf;
}

/* Time one (operation, form, size) for `rounds` rounds and print its line. */
static void run(struct bench *b, enum form f, long bytes, int iters, int warmup,
                int rounds)
{
    double *avg = malloc(sizeof(double) * rounds), t, lat;
    char why[512] = "", err_text[MPI_MAX_ERROR_STRING];
    int k, rnd, err = MPI_SUCCESS, bad = 0, supported = 1;

    b->nreq = 0;
    if (f == PERSISTENT) {
        err = make_persistent(b);
        if (err == MPI_ERR_UNSUPPORTED_OPERATION) {
            supported = 0;
            snprintf(why, sizeof why, "this MPI has no persistent %s", op_names[b->op]);
        } else if (err) {
            bad = 1;
            snprintf(why, sizeof why, "%s_init: %s", op_names[b->op],
                     mpi_error(err, err_text));
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &supported, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (supported && !bad) {
        /* the first call checks the result on known data */
        fill(b);
        err = call(b, f);
        if (err) {
            bad = 1;
            snprintf(why, sizeof why, "%s: %s", op_names[b->op], mpi_error(err, err_text));
        } else {
            bad = check(b, why, sizeof why);
        }
    }
    agree(b, bad, why, sizeof why);
    if (bad || !supported) {
        if (b->rank == 0) {
            printf("{\"op\": \"%s\", \"form\": \"%s\", \"bytes\": %ld, \"count\": %d, "
                   "\"supported\": %s, \"ok\": false, \"error\": ",
                   op_names[b->op], form_names[f], bytes, b->n, supported ? "true" : "false");
            json_string(why);
            printf("}\n");
            fflush(stdout);
        }
        if (supported) free_persistent(b);
        free(avg);
        return;
    }

    for (rnd = 0; rnd < rounds; rnd++) {
        for (k = 0; k < warmup; k++) call(b, f);
        MPI_Barrier(MPI_COMM_WORLD);
        t = MPI_Wtime();
        for (k = 0; k < iters; k++) call(b, f);
        lat = (MPI_Wtime() - t) * 1e6 / iters;
        if (b->op == LATENCY) {
            /* one way is half the round trip; ranks beyond the pair idle */
            lat = b->rank > 1 ? 0.0 : lat / 2;
        }
        MPI_Allreduce(&lat, &avg[rnd], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        avg[rnd] /= b->op == LATENCY ? 2 : b->size;
    }
    free_persistent(b);
    if (b->rank == 0) {
        printf("{\"op\": \"%s\", \"form\": \"%s\", \"bytes\": %ld, \"count\": %d, "
               "\"iters\": %d, \"warmup\": %d, \"supported\": true, \"ok\": true, "
               "\"error\": \"\", \"rounds_us\": [",
               op_names[b->op], form_names[f], bytes, b->n, iters, warmup);
        for (rnd = 0; rnd < rounds; rnd++)
            printf("%s%.4f", rnd ? ", " : "", avg[rnd]);
        printf("]}\n");
        fflush(stdout);
    }
    free(avg);
}

int main(int argc, char **argv)
{
    static const struct dtype dtypes[] = {
        {"float32", MPI_FLOAT, 4}, {"float64", MPI_DOUBLE, 8},
        {"int8", MPI_INT8_T, 1}, {"uint8", MPI_UINT8_T, 1}, {"int16", MPI_INT16_T, 2},
        {"int32", MPI_INT32_T, 4}, {"int64", MPI_INT64_T, 8},
    };
    const char *dtype_names[] = {"float32", "float64", "int8", "uint8", "int16",
                                 "int32", "int64"};
    int ops[NOPS], forms[3], opt, provided, o, f, a, k, thread_multiple = 0;
    int iters = 1000, warmup = 100, iters_large = 100, warmup_large = 10, rounds = 1;
    long large = 8192, *sizes;
    int nsizes = 0, dt = 0;
    struct bench b;

    memset(ops, 0, sizeof ops);
    ops[ALLREDUCE] = 1;
    memset(forms, 0, sizeof forms);
    forms[BLOCKING] = 1;
    while ((opt = getopt(argc, argv, "o:f:d:i:w:I:W:L:r:t")) != -1) {
        switch (opt) {
        case 'o': if (parse_list(optarg, op_names, NOPS, ops)) return 2; break;
        case 'f': if (parse_list(optarg, form_names, 3, forms)) return 2; break;
        case 'd':
            dt = lookup(optarg, dtype_names, 7);
            if (dt < 0) {
                fprintf(stderr, "osu_c: unsupported dtype %s\n", optarg);
                return 2;
            }
            break;
        case 'i': iters = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'I': iters_large = atoi(optarg); break;
        case 'W': warmup_large = atoi(optarg); break;
        case 'L': large = atol(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        case 't': thread_multiple = 1; break;
        default:
            fprintf(stderr, "usage: %s [-o op,...] [-f form,...] [-d dtype] [-i iters] "
                    "[-w warmup] [-I iters] [-W warmup] [-L bytes] [-r rounds] [-t] "
                    "[bytes ...]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1 || iters_large < 1 || warmup < 0 || warmup_large < 0 || rounds < 1) {
        fprintf(stderr, "osu_c: iterations and rounds must be >= 1, warm-up >= 0\n");
        return 2;
    }
    sizes = malloc(sizeof(long) * (argc - optind + 1));
    for (a = optind; a < argc; a++) {
        sizes[nsizes] = atol(argv[a]);
        if (sizes[nsizes] < 1) {
            fprintf(stderr, "osu_c: message size must be >= 1 byte, got %s\n", argv[a]);
            return 2;
        }
        nsizes++;
    }
    if (nsizes == 0)
        sizes[nsizes++] = 4;

    MPI_Init_thread(&argc, &argv, thread_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE,
                    &provided);
    memset(&b, 0, sizeof b);
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.size);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    b.dt = dtypes[dt];
    b.counts = malloc(sizeof(int) * b.size);
    b.displs = malloc(sizeof(int) * b.size);

    for (o = 0; o < NOPS; o++) {
        if (!ops[o]) continue;
        if (o == LATENCY && b.size < 2) {
            if (b.rank == 0)
                printf("{\"op\": \"latency\", \"supported\": false, \"ok\": false, "
                       "\"error\": \"latency needs 2 ranks\"}\n");
            continue;
        }
        for (a = 0; a < nsizes; a++) {
            long bytes = o == BARRIER ? 0 : sizes[a];
            size_t ns, nr;
            if (o == BARRIER && a > 0) break;       /* one size: none */
            b.op = (enum op)o;
            b.n = o == BARRIER ? 0 : (int)(bytes / b.dt.size);
            if (o != BARRIER && b.n < 1) continue;
            b.blk = b.n / b.size > 1 ? b.n / b.size : 1;
            for (k = 0; k < b.size; k++) {
                if (o == REDUCE_SCATTER)    /* as osu_reduce_scatter splits */
                    b.counts[k] = b.n / b.size + (k < b.n % b.size ? 1 : 0);
                else
                    b.counts[k] = b.n;
                b.displs[k] = k ? b.displs[k - 1] + b.counts[k - 1] : 0;
            }
            buffer_sizes(&b, &ns, &nr);
            b.sbuf = calloc(ns ? ns : 1, b.dt.size);
            b.rbuf = calloc(nr ? nr : 1, b.dt.size);
            if (!b.sbuf || !b.rbuf) {
                fprintf(stderr, "osu_c: out of memory at %ld bytes\n", bytes);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            for (f = 0; f < 3; f++) {
                int big = bytes > large;
                if (forms[f])
                    run(&b, (enum form)f, bytes, big ? iters_large : iters,
                        big ? warmup_large : warmup, rounds);
            }
            free(b.sbuf);
            free(b.rbuf);
        }
    }
    free(b.counts);
    free(b.displs);
    free(sizes);
    MPI_Finalize();
    return 0;
}
