# Sourced by the A/B scripts (dsv4_ab.sh, prefill_ab.sh, encode_ab.sh, tq_decode_ab.sh, tq_step_ab.sh) from the
# repository root: the build configuration
# (configure.sh), $OUT (default ./out), the sides that scripts/gpu/dsv4_ab_prepare.sh exported into .ab (carried
# with the run) and their concurrent builds. PREBUILT=1: the sides' binaries were built on the development machine
# by scripts/gpu/ab_prebuild.sh and carried in .ab (the working tree's as .ab/new), so no side is built here.
source scripts/gpu/configure.sh
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"

# ab_sides: SIDES=(new <exported sides>) and DIR[side] = its tree ("." for new, the working tree). Exits when
# there is no .ab/base.
ab_sides() {
  if [ ! -f .ab/base/CMakeLists.txt ]; then
    echo "error: no .ab/base: run scripts/gpu/dsv4_ab_prepare.sh REV first and carry .ab to this machine" >&2
    exit 2
  fi
  SIDES=(new)
  if [ -f .ab/sides ]; then
    while read -r name _; do SIDES+=("$name"); done < .ab/sides
  else
    SIDES+=(base)  # (older .ab directories have only base and base_rev)
  fi
  declare -gA DIR=([new]=.)
  declare -gA SIDE_TARGETS=()
  [ "${PREBUILT:-0}" = 1 ] && DIR[new]=.ab/new
  local s
  for s in "${SIDES[@]}"; do [ "$s" = new ] || DIR[$s]=".ab/$s"; done
}

# ab_side_targets SIDE NEW BASE FURTHER: the targets side SIDE builds (ab_build's three lists), unless the calling
# script set SIDE_TARGETS[SIDE] (an associative array) for it.
ab_side_targets() {
  if [ -n "${SIDE_TARGETS[$1]+set}" ]; then
    echo "${SIDE_TARGETS[$1]}"
    return
  fi
  case "$1" in
    new) echo "$2" ;;
    base) echo "$3" ;;
    *) echo "$4" ;;
  esac
}

# ab_build "TARGETS OF NEW" "TARGETS OF BASE" ["TARGETS OF THE FURTHER SIDES", default those of base]: builds every
# side in build-gpu of its tree, all at once (each build is dominated by a few long nvcc compilations, so one at a
# time would leave most of the 16 cores idle); logs in $OUT/ab_build_<side>.log. Exported trees use this tree's
# carried dependencies (.deps) through a link. Exits when a build fails.
ab_build() {
  local t0 s d targets further="${3:-$2}"
  if [ "${PREBUILT:-0}" = 1 ]; then
    ab_prebuilt "$@"
    return
  fi
  t0=$(date +%s)
  local -A pid=()
  for s in "${SIDES[@]}"; do
    d=${DIR[$s]}
    [ "$d" != . ] && [ -d .deps ] && [ ! -e "$d/.deps" ] && ln -s "$PWD/.deps" "$d/.deps"
    targets=$(ab_side_targets "$s" "$1" "$2" "$further")
    # shellcheck disable=SC2086  # (a list of targets)
    (cd "$d" && gpu_configure build-gpu "$OUT/ab_build_$s.log" && cmake --build build-gpu -j8 --target $targets \
        >> "$OUT/ab_build_$s.log" 2>&1) &
    pid[$s]=$!
  done
  for s in "${SIDES[@]}"; do
    wait "${pid[$s]}" || { echo "error: build of side $s failed"; grep -E "error" -A3 "$OUT/ab_build_$s.log" | head -30; exit 1; }
  done
  echo "built ${#SIDES[@]} sides in $(( $(date +%s) - t0 )) s: ${SIDES[*]}; $(tr '\n' ';' < .ab/sides 2>/dev/null || cat .ab/base_rev)"
}

# ab_prebuilt (ab_build's arguments): with PREBUILT=1, checks that every side has its targets' executables in
# ${DIR[side]}/build-gpu (scripts/gpu/ab_prebuild.sh put them there) and exports the run-time library path of the
# carried dependencies; exits when one is missing.
ab_prebuilt() {
  local s t targets further="${3:-$2}"
  bash scripts/gpu/ab_unpack.sh  # (executables that ab_park.sh gzipped to fit the carry)
  [ -d .deps/usr ] && export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
  for s in "${SIDES[@]}"; do
    targets=$(ab_side_targets "$s" "$1" "$2" "$further")
    for t in $targets; do
      if [ -z "$(find "${DIR[$s]}/build-gpu" -name "$t" -type f 2>/dev/null | head -1)" ]; then
        echo "error: side $s has no prebuilt $t in ${DIR[$s]}/build-gpu: run scripts/gpu/ab_prebuild.sh first" >&2
        exit 1
      fi
    done
  done
  echo "prebuilt sides: ${SIDES[*]}; $(tr '\n' ';' < .ab/sides 2>/dev/null || cat .ab/base_rev)"
}

# ab_check NAME TESTS_FILTER SANITIZE_FILTER LINES [TIMEOUT] [BINARY]: the CUDA tests matching TESTS_FILTER of
# BINARY (default: the new side's TurboQuant test binary; log $OUT/NAME_tests.log; prints the results, failures
# and the lines matching the regex LINES), then compute-sanitizer memcheck and racecheck on SANITIZE_FILTER
# ($OUT/NAME_<tool>.log). Sets CHECK_RC to the first nonzero exit code (0 when everything passed). Tests that run
# past their timeout (124) mean a hang: the sanitizers would hang too, so they are skipped (and
# ab_build_and_check stops the script) instead of spending the run's device time on their timeouts.
ab_check() {
  local name=$1 tests=$2 small=$3 lines=$4 bin=${6:-${DIR[new]:-.}/build-gpu/tests/cuda/kvcompact_cuda_tests} tool code
  timeout "${TEST_TIMEOUT:-${5:-300}}" "$bin" --gtest_filter="$tests" > "$OUT/${name}_tests.log" 2>&1
  CHECK_RC=$?
  echo "$name tests ($bin) exit code: $CHECK_RC"
  grep -E "^\[ *(PASSED|FAILED) |Failure" "$OUT/${name}_tests.log" | head -20
  grep -E "$lines" "$OUT/${name}_tests.log" | sed -E 's/entries.*occupancy=[0-9]+: //' | head -40
  if [ "$CHECK_RC" = 124 ]; then
    echo "$name tests timed out (a hang?): last lines of the log, sanitizers skipped"
    tail -5 "$OUT/${name}_tests.log"
    return
  fi
  for tool in memcheck racecheck; do
    timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$tool" --error-exitcode 3 "$bin" \
      --gtest_filter="$small" > "$OUT/${name}_$tool.log" 2>&1
    code=$?
    echo "$tool exit code: $code ; $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/${name}_$tool.log" | head -1)"
    [ "$CHECK_RC" != 0 ] || CHECK_RC=$code
  done
}

# ab_build_and_check BENCH_TARGET NAME TESTS_FILTER SANITIZE_FILTER LINES [TIMEOUT]: the sides (ab_sides), their
# builds of BENCH_TARGET (the new side also builds the CUDA tests unless TESTS=0), then ab_check unless TESTS=0.
# Sets CHECK_RC (0 when the checks passed or did not run).
ab_build_and_check() {
  ab_sides
  CHECK_RC=0
  if [ "${TESTS:-1}" = 1 ]; then
    ab_build "$1 kvcompact_cuda_tests" "$1"
    ab_check "$2" "$3" "$4" "$5" "${6:-300}"
    if [ "$CHECK_RC" = 124 ]; then
      echo "stopping: the new side's tests hung, so its benchmark would too"
      exit 124
    fi
  else
    ab_build "$1" "$1"
  fi
}

# ab_pack_logs: the sides' build, test and sanitizer logs into $OUT/ab_logs.tgz (the device tool brings back at
# most 8 files; the CSVs stay beside the archive).
ab_pack_logs() {
  (cd "$OUT" && pack_out ab_logs ab_build_*.log ./*_tests.log ./*_memcheck.log ./*_racecheck.log)
}

# ab_bench_rounds BENCH CSV HEADER AWK: runs BENCH (its path in each side's build-gpu, with $BENCH_ARGS) on every
# side, alternating, $ROUNDS times, so that the card's drift hits all sides alike; AWK (given r = round and s =
# side) turns the benchmark's lines into CSV rows, written after HEADER to CSV.
ab_bench_rounds() {
  local bench="$1" csv="$2" header="$3" prog="$4" r s st failed=0
  echo "$header" > "$csv"
  for r in $(seq 1 "$ROUNDS"); do
    for s in "${SIDES[@]}"; do
      # shellcheck disable=SC2086  # (BENCH_ARGS is a list of arguments)
      timeout 120 "${DIR[$s]}/build-gpu/$bench" ${BENCH_ARGS:-} 2>&1 | awk -v r="$r" -v s="$s" "$prog" >> "$csv"
      st=${PIPESTATUS[0]}
      if [ "$st" != 0 ]; then
        # Its rows may be missing from the CSV: say so rather than average fewer rounds silently.
        echo "warning: side $s, round $r: $bench exited with $st (124: timed out)" >&2
        failed=1
      fi
    done
  done
  return "$failed"
}
