#!/usr/bin/env bash
# Builds the binaries of an A/B run on this machine (nvcc for sm_90a; no GPU needed), so that the GPU machine
# only runs them: a side's build there cost 140-170 s of each dsv4_ab.sh run's device time. Run it after
# scripts/gpu/dsv4_ab_prepare.sh; then on the GPU machine, carrying ".deps" and ".ab", run the A/B script with
# PREBUILT=1 (e.g. PREBUILT=1 CASES='fp8 8 1048576' scripts/gpu/dsv4_ab.sh 2).
# Usage: scripts/gpu/ab_prebuild.sh TARGET [TARGET ...]     (e.g. kvcompact_cuda_dsv4_decode_bench kvcompact_cuda_dsv4_tests)
# Every side builds every TARGET with the cuda-release preset (the flags of scripts/gpu/configure.sh): the working
# tree ("new") in build/cuda-release, each exported side in a git worktree of its revision under build/ab-src/<side>
# (kept between runs, so a later build of a nearby revision is incremental). Each TARGET's executable is copied to
# .ab/<side>/build-gpu/<its path in the build tree> (.ab/new for the working tree), where the A/B scripts look.
# Binaries built here run there: the same nvcc (13.0), and the shared libraries they need (fmt, xxHash) are the
# ones carried in .deps. A copy of a TARGET that scripts/gpu/ab_park.sh had parked is removed (it is older).
# NEW_REV=<rev>: the "new" side is that revision (a worktree under build/ab-src/new) instead
# of the working tree — e.g. a wip branch while main is checked out; .ab/new_rev records what "new" was built from.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ]; then
  echo "usage: $0 TARGET [TARGET ...]" >&2
  exit 2
fi
if [ ! -f .ab/sides ]; then
  echo "error: no .ab/sides: run scripts/gpu/dsv4_ab_prepare.sh REV [REV ...] first" >&2
  exit 2
fi
root=$PWD

# build_side NAME SOURCE_DIR: builds the targets in SOURCE_DIR/build/cuda-release and copies them to .ab/NAME.
build_side() {
  local name=$1 src=$2 t0 bin rel
  t0=$(date +%s)
  (cd "$src" && cmake --preset cuda-release > /dev/null && cmake --build --preset cuda-release -j"$(nproc)" --target "${targets[@]}") \
    > "$root/.ab/prebuild_$name.log" 2>&1 || {
    grep -E "error" -A3 "$root/.ab/prebuild_$name.log" | head -30
    echo "error: the build of side $name failed (log: .ab/prebuild_$name.log)" >&2
    exit 1
  }
  for t in "${targets[@]}"; do
    bin=$(find "$src/build/cuda-release" -name "$t" -type f -perm -u+x | head -1)
    [ -n "$bin" ] || { echo "error: side $name built no executable $t" >&2; exit 1; }
    rel=${bin#"$src/build/cuda-release/"}
    mkdir -p "$root/.ab/$name/build-gpu/$(dirname "$rel")"
    cp "$bin" "$root/.ab/$name/build-gpu/$rel"
    rm -f "$root/.ab/$name/build-gpu/$rel.gz"  # (an older copy that ab_park.sh gzipped)
    # An older copy parked by ab_park.sh would come back over this one when it is next named there.
    rm -f "$root/build/ab-parked/$name/build-gpu/$rel"
  done
  echo "side $name: built $(IFS=' '; echo "${targets[*]}") in $(( $(date +%s) - t0 )) s"
}

# worktree NAME REV: build/ab-src/NAME checked out at REV (created on first use); prints its path.
worktree() {
  local wt="build/ab-src/$1"
  if [ -e "$wt/.git" ]; then
    git -C "$wt" checkout -q --detach "$2"
  else
    mkdir -p build/ab-src
    git worktree add -q --detach "$wt" "$2"
  fi
  echo "$root/$wt"
}

targets=("$@")
if [ -n "${NEW_REV:-}" ]; then
  new_rev=$(git rev-parse --verify --quiet "$NEW_REV^{commit}") || { echo "error: NEW_REV '$NEW_REV' is not a commit" >&2; exit 2; }
  build_side new "$(worktree new "$new_rev")"
  echo "$new_rev" > .ab/new_rev
else
  build_side new "$root"
  echo "working tree at $(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' + uncommitted changes')" > .ab/new_rev
fi
while read -r name rev; do
  build_side "$name" "$(worktree "$name" "$rev")"
done < .ab/sides
echo "carry \".deps\" and \".ab\"; on the GPU machine run the A/B script with PREBUILT=1"
scripts/gpu/carry_size.sh .deps .ab || true
