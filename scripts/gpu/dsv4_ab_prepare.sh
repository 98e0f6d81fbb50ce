#!/usr/bin/env bash
# Prepares an A/B run of the DeepSeek-V4 decode step (scripts/gpu/dsv4_ab.sh) on this machine: exports git
# revision REV (the "base" side; the working tree is the "new" side) into .ab/base, which git ignores, so the
# device run must carry it. Further revisions become further sides (.ab/<name>, the revision with / and : as -),
# all measured in the same run, so several candidate branches cost one build of the base. The GPU machine has no
# git history, hence the export here.
# Usage: scripts/gpu/dsv4_ab_prepare.sh REV [REV ...]      then run on the GPU machine, carrying ".ab":
#        scripts/gpu/dsv4_ab.sh [ROUNDS]                   (see there)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ]; then
  echo "usage: $0 REV [REV ...]" >&2
  exit 2
fi
names=() revs=()
for arg in "$@"; do
  rev=$(git rev-parse --verify --quiet "$arg^{commit}") || { echo "error: '$arg' is not a commit" >&2; exit 2; }
  name=base
  [ ${#names[@]} -eq 0 ] || name=$(echo "$arg" | tr '/:' '--')
  for taken in new "${names[@]}"; do
    [ "$name" != "$taken" ] || { echo "error: side name '$name' (from '$arg') is taken" >&2; exit 2; }
  done
  names+=("$name")
  revs+=("$rev")
done
# (A fresh .ab: whatever was in it — prebuilt binaries, a hand-written driver — goes.)
rm -rf .ab
mkdir -p .ab
: > .ab/sides
echo "${revs[0]}" > .ab/base_rev
for i in "${!names[@]}"; do
  mkdir -p ".ab/${names[$i]}"
  # (Without docs/: no build reads it, and with its result files four sides overran the 64 MiB a run may carry.)
  git archive "${revs[$i]}" -- . ':(exclude)docs' | tar -x -C ".ab/${names[$i]}"
  echo "${names[$i]} ${revs[$i]}" >> .ab/sides
  echo "${names[$i]}: $(git log --oneline -1 "${revs[$i]}") exported to .ab/${names[$i]} ($(du -sh ".ab/${names[$i]}" | cut -f1))"
done
echo "carry \".ab\" with the run"
