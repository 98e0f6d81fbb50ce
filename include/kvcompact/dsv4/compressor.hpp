// DeepSeek-V4 compressor math: softmax-gated pooling of m tokens (with the ratio-4 overlap), RMSNorm
// with weight, RoPE at the group's first position on the tail, then the model's FP8 (main branch) or
// Hadamard + FP4 (indexer branch) rounding. The recurrent state layout is the reference's
// (kv_state / score_state F32 [coff*m, coff*d_c]); decode and prefill share one per-token update and one
// pooling function, so any split of the same tokens leaves the same state bits and emits the same rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/dsv4/rope.hpp"

namespace kvcompact::dsv4 {

enum class CompressorBranch : std::uint8_t {
  Main,     // d_c = 512 rows for attention: FP8 e4m3 on [0, 448)
  Indexer,  // d_c = 128 rows for the lightning indexer: Hadamard, then FP4 e2m1 on all dims
};

// One compressor's shape and learned constants. Pointers are borrowed and must outlive the call.
struct CompressorParams {
  std::uint32_t ratio = 4;                 // m: 4 (overlapping) or 128
  bool overlap = true;                     // the ratio-4 overlap (coff = 2); the model: ratio == 4
  std::uint32_t width = kHeadDim;          // d_c: 512 (Main) or 128 (Indexer)
  CompressorBranch branch = CompressorBranch::Main;
  const float* ape = nullptr;              // [m, coff * d_c], added to z by slot t mod m
  const float* norm_weight = nullptr;      // [d_c] RMSNorm weight
  const RopeFrequencies* rope = nullptr;   // the layer's (compressed) RoPE table
  float norm_eps = 1e-6f;
  bool simulate_rounding = true;           // apply the model's FP8 / FP4 rounding to emitted rows

  std::uint32_t coff() const { return overlap ? 2u : 1u; }
  std::size_t proj_width() const { return static_cast<std::size_t>(coff()) * width; }   // a_t, z_t width
  std::size_t state_rows() const { return static_cast<std::size_t>(coff()) * ratio; }
  std::size_t state_floats() const { return state_rows() * proj_width(); }
};

// Checks the model's shapes (ratio 4 with overlap or 128 without, width 512 / 128 matching the branch,
// weights present); a bad combination is a bug in the caller (asserts). The pooling-only functions
// below accept any ratio >= 1 and width <= 512 so that small worked examples can be checked.
void check_compressor_params(const CompressorParams& p);

// Fill the states with their initial values: kv 0, score -inf.
void compressor_reset_state(const CompressorParams& p, float* kv_state, float* score_state);

// Number of rows a span [start, start + count) emits: floor(e / m) - floor(start / m).
std::size_t compressor_rows_emitted(std::uint32_t ratio, std::int64_t start, std::size_t count);

// ---- float32 fast path ------------------------------------------------------------------------------
// One decode token at `position`: writes row (coff-1)*m + (t mod m) of both states with (a_t, z_t + ape);
// when (t + 1) mod m == 0, pools the group, finishes the row (norm, RoPE at g*m, rounding) into
// out_row [d_c], shifts rows [m, 2m) to [0, m) for m = 4, and returns true.
bool compressor_decode_step(const CompressorParams& p, float* kv_state, float* score_state,
                            std::int64_t position, const float* a, const float* z, float* out_row);

// `count` tokens from `start` (a, z: [count, coff*d_c]): the same per-token update in order; the emitted
// rows go to out_rows [compressor_rows_emitted(...), d_c] in group order. Returns the number emitted.
std::size_t compressor_prefill(const CompressorParams& p, float* kv_state, float* score_state,
                               std::int64_t start, std::size_t count, const float* a, const float* z,
                               float* out_rows);

// Pooling only (no norm / RoPE / rounding; ape may be null for zeros): the per-token state update and,
// at a group boundary, the per-feature softmax pooling into out_pooled [d_c] and the overlap shift.
// Returns true when a group completed. compressor_decode_step = this + compressor_finish_row.
bool compressor_pool_step(const CompressorParams& p, float* kv_state, float* score_state,
                          std::int64_t position, const float* a, const float* z, float* out_pooled);

// The finishing steps alone, in place on a pooled row: RMSNorm(weight), RoPE at position g*m on the
// last 64 dims, then the branch's rounding (when simulate_rounding). Needs a width that is a multiple of 8
// in [64, 512], the norm weight and the RoPE table (asserts: unlike pooling, no small worked widths).
void compressor_finish_row(const CompressorParams& p, std::int64_t group, float* row);

// ---- float64 oracle ---------------------------------------------------------------------------------
// Group g pooled (before finishing), any ratio / overlap / width; ape may be null for zeros.
std::vector<double> compressor_pooled_f64(const CompressorParams& p, std::int64_t group,
                                          std::span<const float> a_all, std::span<const float> z_all);
// Row g straight from the formula, reading the token projections a_all / z_all ([n, coff*d_c], n at
// least (g+1)*m) instead of any state: per feature j, softmax over the group's items of z + ape, the
// previous group's first-half columns included for m = 4 (weight 0 for g = 0).
std::vector<double> compressor_row_f64(const CompressorParams& p, std::int64_t group,
                                       std::span<const float> a_all, std::span<const float> z_all);

// The state after the first n tokens, in closed form: row (coff-1)*m + i holds token G*m + i for i < rem
// (G = n / m, rem = n mod m) and the previous group's token (G-1)*m + i otherwise (initial values while
// G = 0); for m = 4 rows [0, m) hold group G-1 (initial while G = 0). Scores are float32(z + ape).
void compressor_state_f64(const CompressorParams& p, std::int64_t n, std::span<const float> a_all,
                          std::span<const float> z_all, float* kv_state, float* score_state);

}  // namespace kvcompact::dsv4
