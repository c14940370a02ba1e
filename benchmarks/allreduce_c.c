/*
 * allreduce_c.c - the C reference for mcr's Allreduce latency benchmark.
 *
 * Times MPI_Allreduce(MPI_FLOAT, MPI_SUM) of N floats in the manner of the
 * OSU Micro-Benchmarks: warm-up calls first, then timed iterations with
 * MPI_Wtime, the per-rank average per call averaged over all ranks (OSU's
 * "Avg Latency(us)"). The timed section is repeated several times and the
 * minimum and median of the repetitions are reported as well, because timings
 * on small shared machines are noisy.
 *
 * Two timing modes:
 *   loop (default): MPI_Barrier, then `iters` back-to-back calls timed as one
 *       block; the same method benchmarks/allreduce_latency.py uses for the
 *       Python variants, so both sides include exactly the same work.
 *   per-call (-b): as osu_allreduce does it: each call timed on its own,
 *       with an (untimed) MPI_Barrier after every call.
 *
 * Build:  mpicc -O2 -o allreduce_c allreduce_c.c
 * Usage:  mpiexec -n 2 ./allreduce_c [-i iters] [-w warmup] [-r reps] [-b] [-t]
 *                                    [-j] [N ...]
 *   N        message sizes in floats (default 1); several may be given
 *   -i       timed iterations per repetition (default 10000)
 *   -w       warm-up iterations per repetition (default 1000)
 *   -r       repetitions (default 5)
 *   -b       per-call timing with a barrier after each call (OSU style)
 *   -t       initialize with MPI_THREAD_MULTIPLE (what mpi4py asks for)
 *   -j       print one JSON object per size instead of the text table
 */

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One repetition: returns this rank's average microseconds per call. */
static double time_allreduce(float *sbuf, float *rbuf, int n, int iters,
                             int warmup, int per_call)
{
    double t, total = 0.0;
    int i;

    for (i = 0; i < warmup; i++)
        MPI_Allreduce(sbuf, rbuf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);

    if (per_call) {
        for (i = 0; i < iters; i++) {
            t = MPI_Wtime();
            MPI_Allreduce(sbuf, rbuf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            total += MPI_Wtime() - t;
            MPI_Barrier(MPI_COMM_WORLD);
        }
    } else {
        t = MPI_Wtime();
        for (i = 0; i < iters; i++)
            MPI_Allreduce(sbuf, rbuf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        total = MPI_Wtime() - t;
    }
    return total * 1e6 / iters;
}

int main(int argc, char **argv)
{
    int iters = 10000, warmup = 1000, reps = 5, per_call = 0, thread_multiple = 0;
    int json = 0, rank, size, provided, opt, a, r, i;
    int nsizes = 0, *sizes;

    while ((opt = getopt(argc, argv, "i:w:r:btj")) != -1) {
        switch (opt) {
        case 'i': iters = atoi(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'r': reps = atoi(optarg); break;
        case 'b': per_call = 1; break;
        case 't': thread_multiple = 1; break;
        case 'j': json = 1; break;
        default:
            fprintf(stderr, "usage: %s [-i iters] [-w warmup] [-r reps] [-b] [-t] [-j] [N ...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (iters < 1 || warmup < 0 || reps < 1) {
        fprintf(stderr, "iters and reps must be >= 1, warmup >= 0\n");
        return 2;
    }
    sizes = malloc(sizeof(int) * (argc - optind + 1));
    for (a = optind; a < argc; a++) {
        sizes[nsizes] = atoi(argv[a]);
        if (sizes[nsizes] < 1) {
            fprintf(stderr, "message size must be >= 1 float, got %s\n", argv[a]);
            return 2;
        }
        nsizes++;
    }
    if (nsizes == 0)
        sizes[nsizes++] = 1;

    if (thread_multiple)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    if (rank == 0 && !json)
        printf("# MPI_Allreduce MPI_FLOAT MPI_SUM, %d ranks, %d reps x %d iters "
               "(+%d warm-up), %s timing, thread level %d\n"
               "# %10s %12s %12s %12s\n",
               size, reps, iters, warmup, per_call ? "per-call" : "loop",
               provided, "floats", "min(us)", "median(us)", "mean(us)");

    for (a = 0; a < nsizes; a++) {
        int n = sizes[a];
        float *sbuf = malloc(sizeof(float) * n), *rbuf = malloc(sizeof(float) * n);
        double *avg = malloc(sizeof(double) * reps), lat, sum = 0.0;

        for (i = 0; i < n; i++) { sbuf[i] = 1.0f; rbuf[i] = 0.0f; }
        for (r = 0; r < reps; r++) {
            lat = time_allreduce(sbuf, rbuf, n, iters, warmup, per_call);
            MPI_Allreduce(&lat, &avg[r], 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            avg[r] /= size;
            sum += avg[r];
        }
        if (rbuf[0] != (float)size)
            fprintf(stderr, "rank %d: wrong result %g, expected %d\n", rank, rbuf[0], size);
        if (rank == 0) {
            double mean = sum / reps;
            if (json) {
                printf("{\"floats\": %d, \"ranks\": %d, \"iters\": %d, \"warmup\": %d, "
                       "\"mode\": \"%s\", \"thread_level\": %d, \"rounds_us\": [",
                       n, size, iters, warmup, per_call ? "per-call" : "loop", provided);
                for (r = 0; r < reps; r++)
                    printf("%s%.4f", r ? ", " : "", avg[r]);
                printf("]}\n");
            } else {
                qsort(avg, reps, sizeof(double), cmp_double);
                printf("  %10d %12.3f %12.3f %12.3f\n", n, avg[0],
                       reps % 2 ? avg[reps / 2] : 0.5 * (avg[reps / 2 - 1] + avg[reps / 2]),
                       mean);
            }
            fflush(stdout);
        }
        free(sbuf); free(rbuf); free(avg);
    }
    free(sizes);
    MPI_Finalize();
    return 0;
}
