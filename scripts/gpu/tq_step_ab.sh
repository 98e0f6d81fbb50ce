#!/usr/bin/env bash
# A/B of the end-to-end TurboQuant decode step on the GPU machine (kvcompact_cuda_tq_step_bench: per layer the
# appends of every sequence's token, then decode), every side measured in the same run: the working tree ("new")
# against the revisions exported by scripts/gpu/dsv4_ab_prepare.sh into .ab/<side> (carry ".ab"). Builds the
# benchmark on every side concurrently, runs it on every side, alternating, ROUNDS times (BENCH_ARGS, e.g.
# --quick), and prints per case, way (append / batch / deferred / graph / graph_sync / decode) and side the mean
# µs per step and side / base.
# No tests run here: pair it with the test binary's run. CSV of every run in $OUT/tq_step_ab.csv.
# Usage: scripts/gpu/tq_step_ab.sh [ROUNDS]   (default 2)
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/ab_common.sh
ROUNDS="${1:-2}"
TESTS=0 ab_build_and_check kvcompact_cuda_tq_step_bench tq_step '' '' ''
# Benchmark lines: mode batch context append_us batch_us [deferred_us [graph_us graph_sync_us]] decode_us
# per_layer speedup (sides built before append_deferred / append_at_length print fewer columns).
ab_bench_rounds src/cuda/bench/kvcompact_cuda_tq_step_bench "$OUT/tq_step_ab.csv" \
  "round,side,mode,batch,context,way,us" '
  (NF == 8 || NF == 9 || NF == 11) && ($1 == "recommended" || $1 == "seed") {
    p = r "," s "," $1 "," $2 "," $3
    print p ",append," $4; print p ",batch," $5
    if (NF == 11) {
      print p ",deferred," $6; print p ",graph," $7; print p ",graph_sync," $8; print p ",decode," $9
    } else if (NF == 9) { print p ",deferred," $6; print p ",decode," $7 } else print p ",decode," $6 }'
python3 scripts/gpu/ab_table.py "$OUT/tq_step_ab.csv" mode,batch,context,way us
ab_pack_logs
