#!/usr/bin/env bash
# What a device call would copy, measured before making it: the device tool refuses a call whose working tree
# (tracked files and untracked files git does not ignore) plus the ignored paths named in `carry` exceed 64 MiB,
# which the scripts that fill .ab or build/carry could not see (they counted only those paths).
# Usage: scripts/gpu/carry_size.sh [CARRY_PATH ...]     e.g. scripts/gpu/carry_size.sh .deps .ab
# Prints the parts and the total; exits 1 when the total is over the limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
limit=$((64 * 1024 * 1024))
# (Sizes of the regular files under a path, in bytes.)
bytes_of() { find "$1" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}'; }
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$tree
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
printf '%-28s %8s MiB\n' "working tree (git's view)" "$(mib "$tree")"
for p in "$@"; do
  if [ ! -e "$p" ]; then
    printf '%-28s %8s (missing here: the device tool removes it there)\n' "$p" "-"
    continue
  fi
  b=$(bytes_of "$p")
  total=$((total + b))
  printf '%-28s %8s MiB\n' "$p" "$(mib "$b")"
done
printf '%-28s %8s MiB (limit 64 MiB)\n' "total" "$(mib "$total")"
if [ "$total" -gt "$limit" ]; then
  echo "over the limit: park or gzip executables (scripts/gpu/ab_park.sh, PACK=1) or carry fewer paths" >&2
  exit 1
fi
