#!/bin/sh
# The image's runtime stage, as a script so that deploy/check-runtime-rootfs.sh can run the
# same steps in a Debian 12 root filesystem without a Docker engine. Run as root on Debian 12.
set -eu
here=$(dirname "$0")
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
grep -v '^#' "$here/runtime-packages.txt" | xargs apt-get install -y -qq --no-install-recommends
# Downloaded .debs and package lists are of no use at run time.
apt-get clean
rm -rf /var/lib/apt/lists/*
# Numeric ids that Kubernetes' runAsNonRoot can verify (the manifests use 65532 too).
groupadd --system --gid 65532 caliper
useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
  --shell /usr/sbin/nologin caliper 2>&1 | grep -v 'greater than SYS_UID_MAX' || true
id caliper
