#!/usr/bin/env bash
# Puts executables built here (build/cuda-release, the cuda-release preset: nvcc for sm_90a, no GPU needed) into
# build/carry/build-gpu at their build-tree paths, gzipped, for a run_all.sh on the GPU machine without a build
# there: carry ".deps" and "build/carry", and run PREBUILT=build/carry/build-gpu scripts/gpu/run_all.sh ...
# The device tool carries at most 64 MiB, so one call takes only some of the executables (the TurboQuant test
# binary alone is ≈ 18 MB gzipped). Earlier contents of build/carry/build-gpu are removed. Prints the carry's size.
# Usage: scripts/gpu/carry_prebuilt.sh TARGET [TARGET ...]   (e.g. kvcompact_cuda_tests kvcompact_cuda_bench)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ]; then
  echo "usage: $0 TARGET [TARGET ...]" >&2
  exit 2
fi
src=build/cuda-release
dst=build/carry/build-gpu
[ -d "$src" ] || { echo "error: no $src (cmake --preset cuda-release, then build the targets)" >&2; exit 2; }
cmake --build "$src" -j2 --target "$@"
rm -rf "$dst"
for t in "$@"; do
  bin=$(find "$src" -type f -name "$t" -perm -u+x -not -path '*/CMakeFiles/*' | head -1)
  [ -n "$bin" ] || { echo "error: no executable $t under $src" >&2; exit 2; }
  rel=${bin#"$src"/}
  mkdir -p "$dst/$(dirname "$rel")"
  gzip -c "$bin" > "$dst/$rel.gz"
done
scripts/gpu/carry_size.sh .deps build/carry || true
