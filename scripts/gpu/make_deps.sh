#!/usr/bin/env bash
# Copies the build dependencies the GPU machine lacks (fmt, nlohmann-json, CLI11, xxHash, GoogleTest) from this
# Debian machine's installed -dev packages into .deps/usr, which run_all.sh passes as CMAKE_PREFIX_PATH.
# .deps is ignored through .git/info/exclude; name it in the device tool's `carry` list (≈ 5 MB).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .deps && mkdir -p .deps
for p in libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libxxhash-dev libxxhash0 libgtest-dev libgmock-dev; do
  dpkg -L "$p" | grep -v -e "/doc/" -e "/man/" -e "/share/lintian" | while read -r f; do
    if [ -f "$f" ] || [ -L "$f" ]; then mkdir -p ".deps$(dirname "$f")"; cp -a "$f" ".deps$f"; fi
  done
done
gd=$(git rev-parse --git-dir)
mkdir -p "$gd/info"
grep -q '^/.deps/' "$gd/info/exclude" 2>/dev/null || echo '/.deps/' >> "$gd/info/exclude"
du -sh .deps
