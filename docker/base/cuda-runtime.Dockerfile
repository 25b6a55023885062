# CUDA runtime base without a registry: the runtime libraries llama.cpp's CUDA backend loads (cudart, cuBLAS,
# cuBLASLt) taken from the offline devel base, on the registry-free Debian runtime; no toolkit, no driver.
ARG CUDA_DEVEL
ARG DEBIAN_RUNTIME
FROM ${CUDA_DEVEL} AS toolkit
FROM ${DEBIAN_RUNTIME}
ARG CUDA_PREFIX=/usr/local/cuda-13.0
ARG CUDA_VERSION=13.0.1
COPY --from=toolkit ${CUDA_PREFIX}/version.json ${CUDA_PREFIX}/
COPY --from=toolkit ${CUDA_PREFIX}/lib64/libcudart.so.13 ${CUDA_PREFIX}/lib64/libcublas.so.13 \
     ${CUDA_PREFIX}/lib64/libcublasLt.so.13 ${CUDA_PREFIX}/lib64/
# The driver (libcuda.so.1) is not here: the NVIDIA container runtime mounts the host's at run time.
RUN set -eu; \
    name="$(basename "${CUDA_PREFIX}")"; \
    ln -s "$name" /usr/local/cuda; \
    echo "${CUDA_PREFIX}/lib64" > "/etc/ld.so.conf.d/988_${name%.*}.conf"; \
    ldconfig
ENV CUDA_VERSION=${CUDA_VERSION} \
    PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
