#!/bin/sh
# Makes the Dockerfile's Debian 12 base images locally, with mmdebstrap, and imports them into
# buildah's storage under the names the Dockerfile's FROM lines use (debian:bookworm and
# debian:bookworm-slim), so an image builds without pulling from a registry. The root file
# systems are cached as tarballs in CACHE_DIR and only made when missing (or with --refresh).
# Usage: make-base-images.sh [--refresh] CACHE_DIR. Needs root, mmdebstrap, buildah and Debian's
# mirror (deb.debian.org, or MIRROR).
set -eu
refresh=false
if [ "${1:-}" = --refresh ]; then refresh=true; shift; fi
cache=${1:?usage: make-base-images.sh [--refresh] CACHE_DIR}
mirror=${MIRROR:-http://deb.debian.org}
mkdir -p "$cache"

# The slim image leaves out what debian:bookworm-slim leaves out: docs, man pages, locales.
slim_opts="--dpkgopt=path-exclude=/usr/share/doc/* --dpkgopt=path-include=/usr/share/doc/*/copyright
  --dpkgopt=path-exclude=/usr/share/man/* --dpkgopt=path-exclude=/usr/share/info/*
  --dpkgopt=path-exclude=/usr/share/locale/* --dpkgopt=path-include=/usr/share/locale/locale.alias
  --dpkgopt=path-exclude=/usr/share/lintian/*"

make_one() {  # NAME TARBALL EXTRA_MMDEBSTRAP_OPTS
  name=$1 tar=$2
  if $refresh || [ ! -s "$tar" ]; then
    echo "make-base-images: mmdebstrap $name -> $tar"
    # shellcheck disable=SC2086  # $3 is a list of options
    # merged /usr made by the hook, as Debian's images are, not by the usrmerge package (which
    # would pull in perl).
    mmdebstrap --variant=minbase --format=tar --aptopt='Acquire::Retries "3"' \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr $3 bookworm "$tar.tmp" \
      "deb $mirror/debian bookworm main" \
      "deb $mirror/debian bookworm-updates main" \
      "deb $mirror/debian-security bookworm-security main"
    mv "$tar.tmp" "$tar"
  fi
  if $refresh || ! buildah inspect --type image "docker.io/library/$name" >/dev/null 2>&1; then
    echo "make-base-images: importing $tar as docker.io/library/$name"
    ctr=$(buildah from scratch)
    buildah add "$ctr" "$tar" / >/dev/null
    buildah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    buildah commit --rm -q "$ctr" "docker.io/library/$name" >/dev/null
  fi
}
make_one debian:bookworm "$cache/bookworm.tar" ""
make_one debian:bookworm-slim "$cache/bookworm-slim.tar" "$slim_opts"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep 'library/debian:bookworm'
