// The headers and calls of ggml-cuda that need each part of the toolkit: a kernel (nvcc, ptxas, nvlink),
// CUB (CCCL under include/cccl), half and bfloat16 types, cuBLAS, the runtime, and the driver API's VMM calls.
#include <cstdio>
#include <cub/cub.cuh>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void scale(half *x, __nv_bfloat16 *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        x[i] = __hmul(x[i], __float2half(2.0f));
        y[i] = __float2bfloat16(__half2float(x[i]));
    }
}

extern "C" int ggml_cuda_smoke_init(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        fprintf(stderr, "ggml_cuda_init: failed to initialize CUDA: %s\n", cudaGetErrorString(err));
        return -1;
    }
    CUdevice dev;
    size_t granularity = 0;
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    if (cuDeviceGet(&dev, 0) == CUDA_SUCCESS) {
        prop.location.id = dev;
        cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    }
    cublasHandle_t handle;
    if (cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(handle);
    }
    half *x = nullptr;
    __nv_bfloat16 *y = nullptr;
    cudaMalloc(&x, 256 * sizeof(half));
    cudaMalloc(&y, 256 * sizeof(__nv_bfloat16));
    scale<<<1, 256>>>(x, y, 256);
    int *keys = nullptr;
    size_t tmp = 0;
    cub::DeviceRadixSort::SortKeys(nullptr, tmp, keys, keys, 0);
    cudaDeviceSynchronize();
    printf("ggml_cuda_init: found %d CUDA devices (VMM granularity %zu)\n", n, granularity);
    return n;
}
