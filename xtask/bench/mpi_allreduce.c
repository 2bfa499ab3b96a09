/*
 * mpi_allreduce.c: the OpenMPI baseline of `cargo xtask bench collectives`.
 *
 * Times MPI_Allreduce(MPI_FLOAT, MPI_SUM) for each requested size, out of place, like nccl-tests:
 * every iteration is MPI_Barrier, then one timed MPI_Allreduce; the iteration's time is the
 * slowest rank's (MPI_MAX over ranks); the reported time is the median over the timed iterations
 * (warm-up iterations are discarded).
 *
 * Usage: mpi_allreduce SIZE_BYTES:ITERS:WARMUP [SIZE_BYTES:ITERS:WARMUP ...]
 * Output (rank 0, stdout): one JSON object per size and line:
 *   {"size": B, "iters": N, "median_us": T, "min_us": T, "max_us": T}
 *
 * Compiled at bench time with `mpicc -O2` into target/bench/.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc < 2) {
        if (rank == 0) fprintf(stderr, "usage: %s SIZE_BYTES:ITERS:WARMUP ...\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (int a = 1; a < argc; a++) {
        long size = 0, iters = 0, warmup = 0;
        if (sscanf(argv[a], "%ld:%ld:%ld", &size, &iters, &warmup) != 3 || size < 4 || iters < 1 || warmup < 0) {
            if (rank == 0) fprintf(stderr, "bad argument %s (want SIZE_BYTES:ITERS:WARMUP)\n", argv[a]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        int count = (int)(size / 4);
        float *send = malloc((size_t)count * sizeof(float));
        float *recv = malloc((size_t)count * sizeof(float));
        double *times = malloc((size_t)iters * sizeof(double));
        if (!send || !recv || !times) MPI_Abort(MPI_COMM_WORLD, 3);
        for (int i = 0; i < count; i++) send[i] = (float)(rank + 1) * 0.5f + (float)(i % 13);
        memset(recv, 0, (size_t)count * sizeof(float));
        for (long it = 0; it < warmup + iters; it++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = MPI_Wtime() - t0, slowest = 0.0;
            MPI_Reduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (it >= warmup) times[it - warmup] = slowest;
        }
        /* Sanity check: element 0 must be the sum over ranks. */
        float want = 0.0f;
        for (int r = 0; r < world; r++) want += (float)(r + 1) * 0.5f;
        int ok = recv[0] == want, all_ok = 0;
        MPI_Reduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            qsort(times, (size_t)iters, sizeof(double), cmp_double);
            double median = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
            printf("{\"size\": %ld, \"iters\": %ld, \"world\": %d, \"median_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f, \"correct\": %s}\n",
                   size, iters, world, median * 1e6, times[0] * 1e6, times[iters - 1] * 1e6, all_ok ? "true" : "false");
            fflush(stdout);
        }
        free(send);
        free(recv);
        free(times);
    }
    MPI_Finalize();
    return 0;
}
