/*
 * ringside_mpi_job.c: a training-like OpenMPI job for the testbed (`ringside-testbed mpi`).
 *
 * Each step is a compute phase (a sleep: the ranks share the machine's cores, and a busy loop would
 * make every rank a straggler), then one MPI_Allreduce(MPI_FLOAT, MPI_SUM) of --size bytes, done by
 * OpenMPI's own coll_tuned algorithms (chosen with mpirun's --mca options, not here): the traffic
 * is OpenMPI's, not ringside's. One rank may compute --straggler-extra-ms longer per step.
 *
 * Stopping: rank 0 decides (step count or duration) and broadcasts a 4-byte flag after each
 * allreduce, so every rank leaves after the same step and none blocks in a collective the others
 * never enter. The result of every allreduce is checked (element 0 must be the sum over ranks).
 *
 * Output: DIR/rank-R.json per rank, the shape testbed::job::step_times reads:
 *   {"rank": R, "world": N, "size": B, "steps": [{"step", "step_ms", "compute_ms", "comm_ms",
 *    "end_unix_ms", "verified"}, ...], "summary": {...}, "error": null}
 *
 * Usage: ringside_mpi_job --out-dir DIR --size BYTES [--steps N] [--duration-ms MS]
 *        [--compute-ms MS] [--straggler-rank R --straggler-extra-ms MS]
 * Compiled by the testbed with mpicc (the source is embedded in ringside-testbed).
 */
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

typedef struct {
    double step_ms, compute_ms, comm_ms;
    unsigned long long end_unix_ms;
    int verified;
} step_t;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned long long unix_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (unsigned long long)tv.tv_sec * 1000ULL + (unsigned long long)tv.tv_usec / 1000ULL;
}

static void sleep_ms(double ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000.0), (long)((ms - 1000.0 * (double)(long)(ms / 1000.0)) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void usage_abort(int rank, const char *why) {
    if (rank == 0)
        fprintf(stderr,
                "ringside_mpi_job: %s\nusage: ringside_mpi_job --out-dir DIR --size BYTES [--steps N] "
                "[--duration-ms MS] [--compute-ms MS] [--straggler-rank R --straggler-extra-ms MS]\n",
                why);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);

    const char *out_dir = NULL;
    long size = 0, steps = 0, duration_ms = 0, straggler_rank = -1;
    double compute_ms = 50.0, straggler_extra_ms = 0.0;
    for (int a = 1; a < argc; a++) {
        const char *k = argv[a];
        if (a + 1 >= argc) usage_abort(rank, "every option takes a value");
        const char *v = argv[++a];
        char *end = NULL;
        if (!strcmp(k, "--out-dir")) out_dir = v;
        else if (!strcmp(k, "--size")) size = strtol(v, &end, 10);
        else if (!strcmp(k, "--steps")) steps = strtol(v, &end, 10);
        else if (!strcmp(k, "--duration-ms")) duration_ms = strtol(v, &end, 10);
        else if (!strcmp(k, "--compute-ms")) compute_ms = strtod(v, &end);
        else if (!strcmp(k, "--straggler-rank")) straggler_rank = strtol(v, &end, 10);
        else if (!strcmp(k, "--straggler-extra-ms")) straggler_extra_ms = strtod(v, &end);
        else usage_abort(rank, "unknown option");
        if (end && *end) usage_abort(rank, "an option's value is not a number");
    }
    if (!out_dir) usage_abort(rank, "--out-dir is required");
    if (size < 4 || size > (1L << 30)) usage_abort(rank, "--size must be 4 B .. 1 GiB");
    if (steps <= 0 && duration_ms <= 0) usage_abort(rank, "give --steps, --duration-ms or both");
    if (compute_ms < 0 || straggler_extra_ms < 0) usage_abort(rank, "times must be >= 0");

    int count = (int)(size / 4);
    float *send = malloc((size_t)count * sizeof(float));
    float *recv = malloc((size_t)count * sizeof(float));
    size_t cap = 1024, n = 0;
    step_t *rec = malloc(cap * sizeof(step_t));
    if (!send || !recv || !rec) MPI_Abort(MPI_COMM_WORLD, 3);
    for (int i = 0; i < count; i++) send[i] = (float)(rank + 1) * 0.5f + (float)(i % 13);
    float want = 0.0f;
    for (int r = 0; r < world; r++) want += (float)(r + 1) * 0.5f;
    double my_compute = compute_ms + (rank == straggler_rank ? straggler_extra_ms : 0.0);

    double t_begin = now_s(), t_prev = t_begin;
    int all_ok = 1;
    for (long step = 0;; step++) {
        sleep_ms(my_compute);
        double t_c = now_s();
        MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double t_a = now_s();
        int ok = recv[0] == want;
        all_ok &= ok;
        if (n == cap) {
            cap *= 2;
            step_t *bigger = realloc(rec, cap * sizeof(step_t));
            if (!bigger) MPI_Abort(MPI_COMM_WORLD, 3);
            rec = bigger;
        }
        rec[n++] = (step_t){(t_a - t_prev) * 1e3, (t_c - t_prev) * 1e3, (t_a - t_c) * 1e3, unix_ms(), ok};
        t_prev = t_a;
        int stop = 0;
        if (rank == 0)
            stop = (steps > 0 && step + 1 >= steps) || (duration_ms > 0 && (t_a - t_begin) * 1e3 >= (double)duration_ms);
        MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (stop) break;
    }

    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.json", out_dir, rank);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "rank %d: cannot write %s: %s\n", rank, path, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 4);
    }
    double sum_step = 0, sum_comm = 0;
    fprintf(f, "{\"rank\": %d, \"world\": %d, \"size\": %ld, \"steps\": [", rank, world, size);
    for (size_t i = 0; i < n; i++) {
        sum_step += rec[i].step_ms;
        sum_comm += rec[i].comm_ms;
        fprintf(f,
                "%s\n{\"step\": %zu, \"step_ms\": %.3f, \"compute_ms\": %.3f, \"comm_ms\": %.3f, \"end_unix_ms\": %llu, "
                "\"verified\": %s}",
                i ? "," : "", i, rec[i].step_ms, rec[i].compute_ms, rec[i].comm_ms, rec[i].end_unix_ms,
                rec[i].verified ? "true" : "false");
    }
    fprintf(f,
            "\n], \"summary\": {\"steps_completed\": %zu, \"mean_step_ms\": %.3f, \"mean_comm_ms\": %.3f, "
            "\"all_verified\": %s}, \"error\": %s}\n",
            n, n ? sum_step / (double)n : 0.0, n ? sum_comm / (double)n : 0.0, all_ok ? "true" : "false",
            all_ok ? "null" : "\"an allreduce result was wrong\"");
    fclose(f);
    free(send);
    free(recv);
    free(rec);
    MPI_Finalize();
    return all_ok ? 0 : 5;
}
