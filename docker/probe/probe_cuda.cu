// Device-to-device copy bandwidth probe, printed as one JSON line.
// usage: specbench-probe-cuda [MiB, default 1024] [repetitions, default 20]
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    size_t bytes = mib * 1024 * 1024;
    void *src = nullptr, *dst = nullptr;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
        fprintf(stderr, "probe: cudaMalloc of %zu MiB failed\n", mib);
        return 1;
    }
    cudaMemset(src, 1, bytes);
    cudaEvent_t t0, t1;
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    float best_ms = 1e30f;
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(t0);
        cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(t1);
        cudaEventSynchronize(t1);
        float ms = 0;
        cudaEventElapsedTime(&ms, t0, t1);
        if (ms < best_ms) best_ms = ms;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    // A device-to-device copy reads and writes every byte.
    printf("{\"kind\": \"cuda-d2d-copy\", \"device\": \"%s\", \"array_mib\": %zu, \"repetitions\": %d, \"copy_gbs\": %.3f}\n",
           prop.name, mib, reps, 2.0 * bytes / (best_ms / 1e3) / 1e9);
    return 0;
}
