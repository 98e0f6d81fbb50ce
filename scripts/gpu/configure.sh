# Sourced by the GPU scripts (run_all.sh, run_short.sh, profile_dsv4.sh): configures the CUDA build the same way
# for all of them. gpu_configure BUILD_DIR LOG_FILE runs CMake (Release, CUDA on, sm_90a, no CPU benchmarks),
# with the build dependencies from .deps/usr when they were carried there (scripts/gpu/make_deps.sh), and
# exports the library path they need at run time. Returns CMake's status; the log is in LOG_FILE.
# pack_out NAME FILE...: moves those of the files (names relative to $OUT) that exist into $OUT/NAME.tgz — the
# device tool brings back at most 8 files from $OUT, so scripts that leave many logs pack them.
gpu_configure() {
  local build="$1" log="$2" extra=()
  if [ -d .deps/usr ]; then
    extra+=("-DCMAKE_PREFIX_PATH=$PWD/.deps/usr")
    export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  fi
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVCOMPACT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DKVCOMPACT_BUILD_BENCH=OFF "${extra[@]}" > "$log" 2>&1
}

pack_out() {
  local name="$1" present=()
  shift
  for f in "$@"; do [ -f "$OUT/$f" ] && present+=("$f"); done
  [ ${#present[@]} -eq 0 ] || (cd "$OUT" && tar czf "$name.tgz" --remove-files "${present[@]}")
}
