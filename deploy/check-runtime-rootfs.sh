#!/usr/bin/env bash
# Runs the image's runtime stage without a Docker engine: a Debian 12 minbase root filesystem
# (debootstrap, like debian:bookworm-slim), deploy/install-runtime.sh inside it (the script the
# Dockerfile runs), the built caliper-server copied to /opt/caliper/bin, then the server started
# the way the Deployment runs it: uid 65532, read-only root, a tmpfs /tmp, loopback ports.
# Checks the gRPC health service, a small calibration (ingest, finalize), /metrics, and exit 0 on
# SIGTERM. With --prepared, ROOTFS_DIR is used as it is (e.g. a built image's mounted root, as
# tests/deploy/image_build_test.sh does) and BUILD_DIR only provides the test client.
# Manual check (root, network to Debian's mirror, a few minutes); not part of CTest.
#   deploy/check-runtime-rootfs.sh [--prepared] BUILD_DIR [ROOTFS_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prepared=false
if [[ ${1:-} == --prepared ]]; then prepared=true; shift; fi
build=${1:?usage: $0 BUILD_DIR [ROOTFS_DIR]}
rootfs=${2:-/tmp/caliper-runtime-rootfs}
server_bin=$build/server/caliper-server
client_bin=$build/tests/deploy/deploy_test_client
mnt=$(mktemp -d /tmp/caliper-ro-XXXXXX)
out=$(mktemp /tmp/caliper-rootfs-server-XXXXXX.log)
server_pid=""

cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then kill -KILL "$server_pid"; fi
  mountpoint -q "$mnt/tmp" && umount "$mnt/tmp"
  mountpoint -q "$mnt" && umount "$mnt"
  rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT

if $prepared; then
  [[ -x $rootfs/opt/caliper/bin/caliper-server ]] || { echo "FAIL: no server in $rootfs"; exit 1; }
elif [[ ! -x $rootfs/usr/bin/apt-get ]]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq --no-install-recommends debootstrap
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian
fi
if ! $prepared && ! chroot "$rootfs" id caliper >/dev/null 2>&1; then
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  mkdir -p "$rootfs/tmp/runtime"
  cp "$here/install-runtime.sh" "$here/runtime-packages.txt" "$rootfs/tmp/runtime/"
  chroot "$rootfs" /tmp/runtime/install-runtime.sh
  rm -rf "$rootfs/tmp/runtime"
fi
if ! $prepared; then
  mkdir -p "$rootfs/opt/caliper/bin" "$rootfs/opt/caliper/lib"
  cp "$server_bin" "$rootfs/opt/caliper/bin/caliper-server"
  # As the Dockerfile's build stage does: CUDA toolkit libraries (libcudart) next to the binary.
  ldd "$server_bin" | awk '$3 ~ /^\/usr\/local\/cuda/ {print $3}' \
    | xargs -r cp -L -t "$rootfs/opt/caliper/lib"
fi

# The pod's view: read-only root, writable tmpfs /tmp only.
mount --bind "$rootfs" "$mnt"
mount -o remount,bind,ro "$mnt"
mount -t tmpfs -o size=64m tmpfs "$mnt/tmp"
if touch "$mnt/.rw-probe" 2>/dev/null; then echo "FAIL: root is writable"; exit 1; fi

# --device=auto: with no GPU (no driver libcuda) the server must come up on the CPU.
LD_LIBRARY_PATH=/opt/caliper/lib chroot --userspec=65532:65532 "$mnt" \
  /opt/caliper/bin/caliper-server \
  --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --device=auto --log_format=json \
  --drain_timeout=5s >"$out" 2>&1 &
server_pid=$!
for _ in $(seq 1 60); do
  grep -q "listening on" "$out" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$out"; echo "FAIL: server exited"; exit 1; }
  sleep 0.5
done
line=$(grep -m1 "listening on" "$out") || { cat "$out"; echo "FAIL: no startup line"; exit 1; }
echo "$line"
grpc=$(sed -E 's/.*listening on ([0-9.:]+) .*/\1/' <<<"$line")
metrics=$(sed -E 's/.*\(metrics ([0-9.:]+),.*/\1/' <<<"$line")
uid=$(ps -o uid= -p "$server_pid" | tr -d ' ')
[[ $uid == 65532 ]] || { echo "FAIL: server runs as uid $uid"; exit 1; }

"$client_bin" health --target="$grpc"
ingest=$("$client_bin" ingest --target="$grpc" --layers=2 --tokens=8 --kv_heads=2 --head_dim=4 \
  --weights=1 --bad_chunks=1)
echo "$ingest"
session=$(sed -E 's/.*"session_id": "([^"]+)".*/\1/' <<<"$ingest")
"$client_bin" finalize --target="$grpc" --session="$session"
page=$(curl -sf "http://$metrics/metrics")
grep -qx 'caliper_ingested_bytes_total{kind="key"} 512' <<<"$page" \
  || { echo "FAIL: /metrics:"; grep caliper_ingested <<<"$page"; exit 1; }
grep -qx 'caliper_backend_info{backend="cpu"} 1' <<<"$page" || { echo "FAIL: backend"; exit 1; }
grep -qx 'caliper_finalizations_total{result="ok"} 1' <<<"$page" \
  || { echo "FAIL: finalization:"; grep caliper_finalizations <<<"$page"; exit 1; }

kill -TERM "$server_pid"
rc=0
wait "$server_pid" || rc=$?
server_pid=""
[[ $rc == 0 ]] || { cat "$out"; echo "FAIL: exit $rc after SIGTERM"; exit 1; }
grep -q '"event":"stopped"' "$out" || { echo "FAIL: no stopped event"; exit 1; }
echo "runtime rootfs OK: $(chroot "$rootfs" dpkg-query -W -f '${Package}\n' | wc -l) packages," \
  "uid 65532, read-only root, health SERVING, calibration ingested and finalized, exit 0 on SIGTERM"
