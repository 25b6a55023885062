# CUDA devel base without a registry: NVIDIA's CUDA toolkit wheels from PyPI, laid out by harness/cuda_base.py
# into ./cuda of the build context, on the registry-free Debian builder; arranged like nvidia/cuda's devel image.
ARG DEBIAN_BUILDER
FROM ${DEBIAN_BUILDER}
ARG CUDA_PREFIX=/usr/local/cuda-13.0
ARG CUDA_VERSION=13.0.1
COPY cuda ${CUDA_PREFIX}
COPY cuda-devel.sh /tmp/cuda-devel.sh
RUN sh /tmp/cuda-devel.sh "${CUDA_PREFIX}" && rm /tmp/cuda-devel.sh
# The same environment as nvidia/cuda's devel images (LIBRARY_PATH lets `-lcuda` find the link stub).
ENV CUDA_VERSION=${CUDA_VERSION} \
    CUDA_HOME=/usr/local/cuda \
    PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \
    LIBRARY_PATH=/usr/local/cuda/lib64/stubs \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
