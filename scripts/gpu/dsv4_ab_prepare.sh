#!/usr/bin/env bash
# Prepares an A/B run of the DeepSeek-V4 decode step (scripts/gpu/dsv4_ab.sh) on this machine: exports git
# revision REV (the "base" side; the working tree is the other side) into .ab/base, which git ignores, so the
# device run must carry it. The GPU machine has no git history, hence the export here.
# Usage: scripts/gpu/dsv4_ab_prepare.sh REV      then run on the GPU machine, carrying ".ab":
#        scripts/gpu/dsv4_ab.sh [ROUNDS]          (see there)
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 1 ]; then
  echo "usage: $0 REV" >&2
  exit 2
fi
rev=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "error: '$1' is not a commit" >&2; exit 2; }
rm -rf .ab
mkdir -p .ab/base
git archive "$rev" | tar -x -C .ab/base
echo "$rev" > .ab/base_rev
echo "base $(git log --oneline -1 "$rev") exported to .ab/base ($(du -sh .ab/base | cut -f1)); carry \".ab\" with the run"
