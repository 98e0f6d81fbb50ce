// DeepSeek-V4 sparse attention with a sink over a gathered set of 512-wide rows (window rows, oldest first,
// then the layer's compressed rows): s = q . c / sqrt(512), o = sum e^(s-M) c / (e^(sink-M) + sum e^(s-M)),
// then inverse RoPE at the token's position on the output tail. K = V: one row serves as both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/dsv4/rope.hpp"

namespace kvcompact::dsv4 {

// The index set of a token at `position` (absolute positions / compressed row indices; oracle-side
// helpers, the runner builds the same lists from cache slots):
// window positions max(0, t - 127) .. t, oldest first.
std::vector<std::int64_t> window_positions(std::int64_t position);

// Number of rows a token at `position` attends over (the "attention width"): min(t + 1, 128) window rows
// plus min(index_topk, floor((t+1)/4)) for m = 4, floor((t+1)/128) for m = 128, 0 for m = 0.
// E.g. 128 + 8192 = 8320 for m = 128 at t = 2^20 - 1.
std::size_t attention_row_count(std::uint32_t ratio, std::int64_t position, std::size_t index_topk);

// ---- float64 oracle ---------------------------------------------------------------------------------
// out [heads, 512] from q [heads, 512], rows (n pointers to 512 floats), sink [heads]; the inverse RoPE
// at `position` is applied when `rope` is non-null. With no rows the output is 0.
std::vector<double> sparse_attention_f64(std::span<const float> q, std::size_t heads,
                                         std::span<const float* const> rows, std::span<const float> sink,
                                         const RopeFrequencies* rope, std::int64_t position);

// ---- float32 fast path ------------------------------------------------------------------------------
// Reusable score buffer (grown once to heads * rows; no allocation in steady state).
struct AttentionScratch {
  std::vector<float> scores;
};

// Multithreaded over heads (core parallel_for); each head's arithmetic order is fixed, so the result
// does not depend on the thread count. `inverse_rope` (cos / sin at the token's position) may be null. With no
// rows the output is 0, as the oracle's (also with a -inf sink).
void sparse_attention(float* out, const float* q, std::size_t heads, const float* const* rows, std::size_t n_rows,
                      const float* sink, const RopeCosSin* inverse_rope, AttentionScratch& scratch);

}  // namespace kvcompact::dsv4
