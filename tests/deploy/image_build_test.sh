#!/usr/bin/env bash
# Builds the caliper-server image (Dockerfile, target cpu) for real with buildah, on Debian base
# images made locally by deploy/make-base-images.sh (nothing pulled from a registry), then runs
# the built image's root file system the way the Deployment runs it (deploy/check-runtime-rootfs.sh
# --prepared: uid 65532, read-only root, a calibration served) and checks its size and that no
# apt lists or .deb files were left in it. Exits 77 (skip) without root, buildah, runc or mmdebstrap
# (scripts/test.sh image installs them). Base images and compiled objects (ccache) are cached in
# CALIPER_IMAGE_CACHE (default ~/.cache/caliper/image) between runs on one machine.
#   image_build_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=${1:?usage: image_build_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: image_build_test.sh SOURCE_DIR BUILD_DIR}
max_mib=${CALIPER_IMAGE_MAX_MIB:-160}
for tool in buildah runc mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed (scripts/test.sh image)"; exit 77; }
done
[[ $(id -u) == 0 ]] || { echo "SKIP: building the image needs root"; exit 77; }
cache=${CALIPER_IMAGE_CACHE:-$HOME/.cache/caliper/image}
mkdir -p "$cache/ccache"
tag=localhost/caliper-server:ci-cpu
ctr=""
cleanup() {
  if [[ -n $ctr ]]; then buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

"$src/deploy/make-base-images.sh" "$cache"

# --pull=never: the FROM names must resolve to the local base images. --layers keeps the
# dependency layers between runs; the ccache volume keeps compiled objects. runc, since crun
# fails on hybrid cgroups; the host network, so apt in the RUN steps reaches Debian's mirror.
start=$(date +%s)
buildah bud --runtime=runc --network=host --pull=never --layers --target cpu \
  --volume "$cache/ccache:/root/.cache/ccache" --build-arg JOBS="${JOBS:-2}" \
  -t "$tag" -f "$src/Dockerfile" "$src"
echo "image built in $(( $(date +%s) - start )) s"

ctr=$(buildah from --pull=never "$tag")
root=$(buildah mount "$ctr")
bytes=$(du -sxb "$root" | cut -f1)
mib=$(( bytes / 1048576 ))
echo "image root file system: $mib MiB ($(buildah images --format '{{.Size}}' "$tag") as buildah reports it)"
(( mib <= max_mib )) || { echo "FAIL: image is $mib MiB, more than $max_mib"; exit 1; }
leftovers=$(find "$root/var/lib/apt/lists" "$root/var/cache/apt" -type f ! -name lock 2>/dev/null | head -5)
[[ -z $leftovers ]] || { echo "FAIL: apt files left in the image:"; echo "$leftovers"; exit 1; }
config=$(buildah inspect --type image --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' "$tag")
[[ $config == "65532:65532 [/opt/caliper/bin/caliper-server]" ]] \
  || { echo "FAIL: image user/entrypoint: $config"; exit 1; }

"$src/deploy/check-runtime-rootfs.sh" --prepared "$build" "$root"
