#!/bin/sh
# The image's build step: builds only caliper-server (scripts/build.sh, as CI builds) and stages
# it in DEST/bin, with the CUDA toolkit libraries it links (libcudart, found with ldd) in DEST/lib;
# the driver's libcuda comes from the NVIDIA container runtime. Usage: build-server.sh DEST.
set -eu
dest=${1:?usage: build-server.sh DEST}
cd "$(dirname "$0")/.."
scripts/build.sh caliper-server -DCALIPER_BUILD_BENCH=OFF
mkdir -p "$dest/bin" "$dest/lib"
cp "${BUILD_DIR:-build}/server/caliper-server" "$dest/bin/"
ldd "$dest/bin/caliper-server" | awk '$3 ~ /^\/usr\/local\/cuda/ {print $3}' \
  | xargs -r cp -L -t "$dest/lib"
