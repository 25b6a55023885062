/* Device memory bandwidth through llama.cpp's own backend (ggml): a tensor copy on the first GPU device ggml
 * registers, timed per graph, printed as one JSON line.
 * usage: specbench-probe-ggml [MiB per tensor, default 256] [repetitions, default 10]
 * Bytes counted as in STREAM's copy: one tensor read, one written. Any ggml GPU backend (Vulkan, CUDA, ...) works;
 * for Vulkan a software device is used only when GGML_VK_VISIBLE_DEVICES names it (llama.cpp skips it otherwise). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 10;
    if (mib == 0 || reps <= 0) { fprintf(stderr, "usage: %s [MiB] [reps]\n", argv[0]); return 2; }
    ggml_log_set(quiet, NULL);
    ggml_backend_dev_t dev = NULL;
    for (size_t i = 0; i < ggml_backend_dev_count() && !dev; i++) {
        enum ggml_backend_dev_type t = ggml_backend_dev_type(ggml_backend_dev_get(i));
        if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) dev = ggml_backend_dev_get(i);
    }
    if (!dev) {
        fprintf(stderr, "probe: llama.cpp's backends register no GPU device here (a software Vulkan device only "
                        "when GGML_VK_VISIBLE_DEVICES names it)\n");
        return 3;
    }
    ggml_backend_t backend = ggml_backend_dev_init(dev, NULL);
    if (!backend) { fprintf(stderr, "probe: cannot start %s\n", ggml_backend_dev_name(dev)); return 1; }
    struct ggml_init_params params = {4 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true};
    struct ggml_context *ctx = ggml_init(params);
    int64_t n = (int64_t)(mib * 1024 * 1024 / sizeof(float));
    struct ggml_tensor *a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    struct ggml_tensor *b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n);
    struct ggml_tensor *out = ggml_cpy(ctx, a, b);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) { fprintf(stderr, "probe: cannot allocate 2 x %zu MiB on %s\n", mib, ggml_backend_dev_name(dev)); return 1; }
    float *host = malloc(ggml_nbytes(a));
    if (!host) { fprintf(stderr, "probe: cannot allocate %zu MiB on the host\n", mib); return 1; }
    for (int64_t i = 0; i < n; i++) host[i] = (float)(i & 1023);
    ggml_backend_tensor_set(a, host, 0, ggml_nbytes(a));
    ggml_backend_graph_compute(backend, gf);  /* warm-up: pipelines, first touch */
    ggml_backend_synchronize(backend);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        ggml_backend_graph_compute(backend, gf);
        ggml_backend_synchronize(backend);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    float check = 0;
    ggml_backend_tensor_get(b, &check, (size_t)(n / 2 + 7) * sizeof(float), sizeof(float));  /* 7.0 if copied */
    size_t free_b = 0, total_b = 0;
    ggml_backend_dev_memory(dev, &free_b, &total_b);
    enum ggml_backend_dev_type t = ggml_backend_dev_type(dev);
    printf("{\"kind\": \"ggml-copy\", \"backend\": \"%s\", \"device\": \"%s\", \"description\": \"",
           ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), ggml_backend_dev_name(dev));
    for (const char *s = ggml_backend_dev_description(dev); *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s >= 0x20) putchar(*s);
    }
    printf("\", \"type\": \"%s\", \"memory_total_bytes\": %zu, \"memory_free_bytes\": %zu, \"array_mib\": %zu, "
           "\"repetitions\": %d, \"copy_gbs\": %.3f, \"check\": %.1f}\n",
           t == GGML_BACKEND_DEVICE_TYPE_IGPU ? "igpu" : "gpu", total_b, free_b, mib, reps,
           2.0 * (double)ggml_nbytes(a) / best / 1e9, check);
    free(host);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(backend);
    return 0;
}
