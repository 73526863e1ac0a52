#!/usr/bin/env bash
# Installs every Debian package Caliper needs to build, test and run its demo.
# Idempotent: packages already present are skipped, apt only runs when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 python3-venv
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libcivetweb-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  curl openssl clang libclang-rt-14-dev ccache
  libpq-dev postgresql-15
)
# Optional extras callers can ask for (e.g. prometheus for the scrape test, clang for fuzzing).
if [[ $# -gt 0 ]]; then PACKAGES+=("$@"); fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
