#!/usr/bin/env bash
# Keeps only the named executables in .ab/<side>/build-gpu, so that one device call carries what it runs: the
# device tool carries at most 64 MiB of ignored paths per call, and the prebuilt binaries of two sides outgrow it
# (kvcompact_cuda_tests ≈ 25 MB and kvcompact_cuda_tq_step_bench ≈ 23 MB per side). Every other executable there
# moves to build/ab-parked/<same path> (git ignores build*/), and parked executables that are named move back.
# Prints what .ab then holds. A TARGET is an executable's name (every side's) or SIDE:NAME (that side's only).
# PACK=1: the executables kept in .ab are gzipped (≈ 0.75 of their size: two sides' 23 MB step benchmarks and the
# 25 MB test binary, 73 MB, came to 60 MB with .deps), and the A/B scripts and prebuilt_checks.sh unpack them
# there (scripts/gpu/ab_unpack.sh); gzipped executables here are unpacked before anything moves.
# Usage: [PACK=1] scripts/gpu/ab_park.sh TARGET [TARGET ...]
#   e.g. scripts/gpu/ab_park.sh new:kvcompact_cuda_tests new:kvcompact_cuda_dsv4_tests kvcompact_cuda_tq_encode_bench
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ]; then
  echo "usage: $0 TARGET [TARGET ...]" >&2
  exit 2
fi
[ -d .ab ] || { echo "error: no .ab (scripts/gpu/dsv4_ab_prepare.sh, then ab_prebuild.sh)" >&2; exit 2; }
# keep REL: whether REL (<side>/build-gpu/<path>) is named by a TARGET.
keep() {
  local name side t
  name=$(basename "$1")
  side=${1%%/*}
  for t in "${targets[@]}"; do
    [ "$name" = "$t" ] || [ "$side:$name" = "$t" ] && return 0
  done
  return 1
}
targets=("$@")
bash scripts/gpu/ab_unpack.sh
find build/ab-parked -name '*.gz' -type f -exec gunzip -f {} + 2>/dev/null || true
# Parked executables that are named come back; built ones that are not go to the parking place.
if [ -d build/ab-parked ]; then
  while IFS= read -r f; do
    rel=${f#build/ab-parked/}
    if keep "$rel"; then mkdir -p ".ab/$(dirname "$rel")" && mv "$f" ".ab/$rel"; fi
  done < <(find build/ab-parked -type f)
fi
while IFS= read -r f; do
  rel=${f#.ab/}
  if ! keep "$rel"; then mkdir -p "build/ab-parked/$(dirname "$rel")" && mv "$f" "build/ab-parked/$rel"; fi
done < <(find .ab -path '*/build-gpu/*' -type f)
[ "${PACK:-0}" = 1 ] && find .ab -path '*/build-gpu/*' -type f -exec gzip -6 {} +
find .ab -path '*/build-gpu/*' -type f -printf '%s %p\n' | sort -k2
scripts/gpu/carry_size.sh .deps .ab || true  # (what a call carrying .deps and .ab copies, against the 64 MiB limit)
