/* STREAM-like memory bandwidth probe (copy and triad), printed as one JSON line.
 * usage: specbench-probe [MiB per array, default 256] [repetitions, default 10]
 * Bytes counted as in STREAM: copy moves 2 arrays, triad 3 (write-allocate not counted). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <omp.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 10;
    if (mib == 0 || reps <= 0) { fprintf(stderr, "usage: %s [MiB] [reps]\n", argv[0]); return 2; }
    size_t n = mib * 1024 * 1024 / sizeof(double);
    double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double)), *c = malloc(n * sizeof(double));
    if (!a || !b || !c) { fprintf(stderr, "probe: cannot allocate %zu MiB x 3\n", mib); return 1; }
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) { a[i] = 1.0; b[i] = 2.0; c[i] = 0.0; }
    double best_copy = 1e30, best_triad = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        #pragma omp parallel for
        for (size_t i = 0; i < n; i++) c[i] = a[i];
        double t1 = now();
        #pragma omp parallel for
        for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
        double t2 = now();
        if (t1 - t0 < best_copy) best_copy = t1 - t0;
        if (t2 - t1 < best_triad) best_triad = t2 - t1;
    }
    double bytes = (double)n * sizeof(double);
    printf("{\"kind\": \"cpu-stream\", \"threads\": %d, \"array_mib\": %zu, \"repetitions\": %d, "
           "\"copy_gbs\": %.3f, \"triad_gbs\": %.3f, \"check\": %.1f}\n",
           omp_get_max_threads(), mib, reps, 2 * bytes / best_copy / 1e9, 3 * bytes / best_triad / 1e9, a[n / 2]);
    free(a); free(b); free(c);
    return 0;
}
