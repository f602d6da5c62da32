#!/bin/sh
# Builds radixkvd, radixkvctl and radixkv-worker inside the image's build
# stage (deploy/docker/Dockerfile) and lays out what the runtime stage copies:
#   /out/usr/local/bin/{radixkvd,radixkvctl,radixkv-worker}   stripped
#   /out/usr/local/share/radixkv/runtime-packages  Debian packages that ship
#                                                  the binaries' shared libraries
#   /out/usr/local/lib/radixkv/                    cuBLAS (cuda variant only)
# Usage: build.sh cpu|cuda [JOBS]. Run from the source root.
set -eu
variant=$1
jobs=${2:-}
out=/out
case "$variant" in
  cpu) cuda=OFF ;;
  cuda) cuda=ON
        if [ ! -x /usr/local/cuda/bin/nvcc ]; then
          echo "build.sh: VARIANT=cuda needs nvcc at /usr/local/cuda/bin/nvcc" >&2
          exit 1
        fi ;;
  *) echo "build.sh: VARIANT must be cpu or cuda, not '$variant'" >&2; exit 2 ;;
esac

# ccache only when the builder mounted a cache directory at /ccache.
if mountpoint -q /ccache 2>/dev/null; then
  export CCACHE_DIR=/ccache CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
else
  export CCACHE_DISABLE=1
fi

cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DRADIXKV_BUILD_TESTS=OFF -DRADIXKV_BUILD_BENCH=OFF \
  -DRADIXKV_ENABLE_CUDA="$cuda" > /build.configure.log
if [ "$cuda" = ON ] && ! grep -q 'radixkv: CUDA kernels ON' /build.configure.log; then
  cat /build.configure.log >&2
  echo "build.sh: CMake did not enable CUDA" >&2
  exit 1
fi
ccache_counts() {
  ccache --print-stats 2>/dev/null | awk '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { h += $2 }
    $1 == "cache_miss" { m += $2 } END { print h + 0, m + 0 }'
}
[ -n "${CCACHE_DIR:-}" ] && before=$(ccache_counts)
cmake --build /build ${jobs:+-j"$jobs"} --target radixkvd radixkvctl radixkv-worker
if [ -n "${CCACHE_DIR:-}" ]; then
  after=$(ccache_counts)
  # shellcheck disable=SC2086  # two numbers each, split on purpose
  set -- $before $after
  echo "build.sh: ccache $(( $3 - $1 )) hits, $(( $4 - $2 )) misses"
fi

install -d "$out/usr/local/bin" "$out/usr/local/share/radixkv" "$out/usr/local/lib/radixkv"
install -m 0755 -s /build/daemon/radixkvd /build/client/radixkvctl \
  /build/worker/radixkv-worker "$out/usr/local/bin/"

# The packages the runtime stage installs: whoever ships each shared library
# the binaries load (Debian 12 is merged-/usr, so try both spellings).
libs=$(for b in "$out"/usr/local/bin/*; do ldd "$b"; done |
       awk '$3 ~ /^\// {print $3}' | sort -u)
: > /tmp/packages
for lib in $libs; do
  real=$(realpath "$lib")
  owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$real" 2>/dev/null ||
          dpkg -S "${real#/usr}" 2>/dev/null || true)
  if [ -z "$owner" ]; then
    echo "build.sh: no Debian package ships $lib" >&2
    exit 1
  fi
  echo "$owner" | head -n1 | cut -d: -f1 >> /tmp/packages
done
sort -u /tmp/packages > "$out/usr/local/share/radixkv/runtime-packages"
echo "$variant" > "$out/usr/local/share/radixkv/variant"

# The worker loads cuBLAS at run time (dlopen); the driver library comes
# from the NVIDIA container runtime, not from the image.
if [ "$variant" = cuda ]; then
  cp -P /usr/local/cuda/lib64/libcublas.so.* /usr/local/cuda/lib64/libcublasLt.so.* \
    "$out/usr/local/lib/radixkv/"
fi
