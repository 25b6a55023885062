#!/bin/sh
# Completes a CUDA toolkit laid out from NVIDIA's wheels into what nvidia/cuda's devel image has: the unversioned
# .so links the wheels lack, the libcuda.so link stub, the /usr/local/cuda links and the loader's path.
# usage: cuda-devel.sh PREFIX   (e.g. /usr/local/cuda-13.0)
set -eu
prefix="$1"
for dir in "$prefix/lib64" "$prefix/nvvm/lib64"; do
  cd "$dir"
  # libcudart.so -> libcudart.so.13: CMake's FindCUDAToolkit and `-lcudart` look for the unversioned name.
  for f in lib*.so.*; do ln -sf "$f" "${f%%.so.*}.so"; done
done
# libcuda.so belongs to the driver. Link against a stub that exports every driver entry point cuda.h declares
# (under the versioned names its macros select, e.g. cuMemGetInfo_v2), with the driver's soname libcuda.so.1;
# each returns CUDA_ERROR_STUB_LIBRARY (34), as NVIDIA's own stub does if it is ever loaded.
mkdir -p "$prefix/lib64/stubs"
work="$(mktemp -d)"
gcc -E -P -x c -I"$prefix/include" "$prefix/include/cuda.h" \
  | grep -o 'CUresult  *cu[A-Za-z0-9_]* *(' | sed 's/^CUresult  *//; s/ *($//' | sort -u > "$work/symbols"
n="$(wc -l < "$work/symbols")"
[ "$n" -gt 100 ] || { echo "cuda-devel.sh: only $n driver symbols found in cuda.h" >&2; exit 1; }
sed 's/.*/int &(void) { return 34; }/' "$work/symbols" > "$work/stub.c"
gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$prefix/lib64/stubs/libcuda.so" "$work/stub.c"
rm -rf "$work"
echo "cuda-devel.sh: libcuda.so stub with $n driver symbols"
name="$(basename "$prefix")"
ln -s "$name" /usr/local/cuda
ln -s "$name" "/usr/local/${name%.*}"
# The toolkit's libraries on the loader's path (not the stubs: the real libcuda.so.1 comes from the driver).
echo "$prefix/lib64" > "/etc/ld.so.conf.d/988_${name%.*}.conf"
ldconfig
