# nvidia/cuda's devel image plus what docker/Dockerfile's builder stage runs besides the toolkit: CMake (the devel
# images have none) and make/gcc/g++ (build-essential; a no-op where present). The llama.cpp build itself runs
# with no network, so these go into a base made beforehand, with network, as the Debian bases are.
ARG CUDA_DEVEL=nvidia/cuda:13.0.1-devel-ubuntu24.04
FROM ${CUDA_DEVEL}
RUN set -eu; \
    if ! command -v cmake >/dev/null || ! command -v make >/dev/null || ! command -v g++ >/dev/null; then \
      apt-get update; \
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends cmake build-essential; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    cmake --version | head -1; g++ --version | head -1; nvcc --version | tail -1
