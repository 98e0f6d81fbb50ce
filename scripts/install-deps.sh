#!/usr/bin/env bash
# Installs everything kvcompact needs to build and test on a fresh Debian 12 machine (run as root).
# The CUDA backend additionally needs the CUDA toolkit (nvcc); without it the build is CPU-only.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  cmake make g++ git ca-certificates \
  libgtest-dev libgmock-dev libbenchmark-dev \
  libfmt-dev nlohmann-json3-dev libcli11-dev libxxhash-dev \
  clang-14 clang libclang-rt-14-dev \
  python3 >/dev/null
echo "kvcompact dependencies installed" >&2
