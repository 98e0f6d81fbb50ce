#!/usr/bin/env bash
# Unpacks the executables that scripts/gpu/ab_park.sh gzipped (PACK=1) in .ab/<side>/build-gpu, and makes every
# executable there executable again. Idempotent; a no-op without .gz files. The A/B scripts (PREBUILT=1, through
# ab_common.sh) and prebuilt_checks.sh call it first; by hand: scripts/gpu/ab_unpack.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .ab ] || exit 0
find .ab -path '*/build-gpu/*' -name '*.gz' -type f -exec gunzip -f {} +
find .ab -path '*/build-gpu/*' -type f -exec chmod +x {} +
