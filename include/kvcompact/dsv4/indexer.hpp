// DeepSeek-V4 lightning indexer math (ratio-4 layers): the score of compressed row s for the token at t,
// I[s] = sum_h w_h * ReLU(q_h . k_s) over the visible rows s < floor((t+1)/4), and a deterministic top-k
// (higher score first, then lower index; unavailable slots -1). Float64 oracle + float32 fast path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvcompact/dsv4/config.hpp"

namespace kvcompact::dsv4 {

// Visible compressed rows after the token at `position`: floor((position + 1) / ratio).
std::size_t visible_compressed_rows(std::uint32_t ratio, std::int64_t position);

// The model's preparation of the indexer query, in place on q [heads, 128] (already carrying RoPE at
// t on dims [64, 128) from the model): Hadamard (1/sqrt(128)) then FP4 e2m1 in blocks of 32 per head.
void prepare_indexer_query(float* q, std::size_t heads);
void prepare_indexer_query_f64(std::span<double> q, std::size_t heads);

// ---- float64 oracle ---------------------------------------------------------------------------------
// scores[s] for s in [0, rows): q [heads, dim], w [heads], keys [rows, dim].
std::vector<double> indexer_scores_f64(std::span<const float> q, std::span<const float> w,
                                       std::span<const float> keys, std::size_t heads, std::size_t dim);
// out [topk]: the k = min(topk, scores.size()) best rows sorted by (score desc, index asc), a NaN below every
// number, then -1.
void indexer_topk_f64(std::span<std::int32_t> out, std::span<const double> scores);

// ---- float32 fast path ------------------------------------------------------------------------------
// Each head's dot in float32 (eight accumulators, fixed tree), its term fl(w_h * max(dot, 0)), and the terms
// summed per block of 64 heads in a fixed tree (src/dsv4/indexer_head_sum.hpp; the GPU kernel sums in the same
// order and matches these scores bit for bit), blocks in order, then + 0.
// scores [rows]; keys given as row pointers (each `dim` floats) so rows can come from any storage.
void indexer_scores(float* scores, const float* q, const float* w, const float* const* keys, std::size_t rows,
                    std::size_t heads, std::size_t dim);
// Contiguous keys [rows, dim].
void indexer_scores_contiguous(float* scores, const float* q, const float* w, const float* keys,
                               std::size_t rows, std::size_t heads, std::size_t dim);

// Reusable buffers for the selection (no allocation once grown to the largest row count).
struct TopkScratch {
  std::vector<std::int32_t> order;
};
// out [out_len = index_topk]: as the oracle; a NaN score ranks below every number (then by index).
// Returns k = min(out_len, rows).
std::size_t indexer_topk(std::int32_t* out, std::size_t out_len, const float* scores, std::size_t rows,
                         TopkScratch& scratch);

}  // namespace kvcompact::dsv4
