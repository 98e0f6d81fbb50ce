// Compressor pooling, state updates and row finishing (see compressor.hpp). Decode and prefill both go
// through update_token() and pool_state(), defined once here, so their results cannot drift apart.
#include "kvcompact/dsv4/compressor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kvcompact/core/assert.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"

namespace kvcompact::dsv4 {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_pooling_shape(const CompressorParams& p) {
  KVC_ASSERT(p.ratio >= 1 && p.width >= 1 && p.width <= kHeadDim, "compressor: ratio >= 1, width in [1, 512]");
}

float ape_at(const CompressorParams& p, std::size_t slot, std::size_t col) {
  return p.ape == nullptr ? 0.0f : p.ape[slot * p.proj_width() + col];
}

// Column offset of state row i's pooled half: with the overlap, rows [0, m) contribute their first half
// and rows [m, 2m) their second half; without it the only half.
std::size_t pooled_column(const CompressorParams& p, std::size_t row) {
  return (p.coff() == 2 && row >= p.ratio) ? p.width : 0;
}

void update_token(const CompressorParams& p, float* kv_state, float* score_state, std::int64_t position,
                  const float* a, const float* z) {
  const std::size_t pw = p.proj_width();
  const std::size_t slot = static_cast<std::size_t>(position % p.ratio);
  const std::size_t row = static_cast<std::size_t>(p.coff() - 1) * p.ratio + slot;
  std::memcpy(kv_state + row * pw, a, pw * sizeof(float));
  float* s = score_state + row * pw;
  if (p.ape == nullptr) {
    for (std::size_t j = 0; j < pw; ++j) s[j] = z[j] + 0.0f;
  } else {
    const float* ape = p.ape + slot * pw;
    for (std::size_t j = 0; j < pw; ++j) s[j] = z[j] + ape[j];
  }
}

// Per-feature softmax over the state's coff*m items, weighted sum of the values into out [d_c].
void pool_state(const CompressorParams& p, const float* kv_state, const float* score_state, float* out) {
  const std::size_t d = p.width;
  const std::size_t pw = p.proj_width();
  const std::size_t items = p.state_rows();
  float mx[kHeadDim];
  float sum[kHeadDim];
  for (std::size_t j = 0; j < d; ++j) {
    mx[j] = kNegInf;
    sum[j] = 0.0f;
    out[j] = 0.0f;
  }
  for (std::size_t i = 0; i < items; ++i) {
    const float* s = score_state + i * pw + pooled_column(p, i);
    for (std::size_t j = 0; j < d; ++j) mx[j] = std::max(mx[j], s[j]);
  }
  for (std::size_t i = 0; i < items; ++i) {
    const std::size_t col = pooled_column(p, i);
    const float* s = score_state + i * pw + col;
    const float* v = kv_state + i * pw + col;
    for (std::size_t j = 0; j < d; ++j) {
      const float e = std::exp(s[j] - mx[j]);  // exp(-inf) = 0 for unfilled overlap items
      sum[j] += e;
      out[j] += e * v[j];
    }
  }
  for (std::size_t j = 0; j < d; ++j) out[j] /= sum[j];
}

bool pool_step(const CompressorParams& p, float* kv_state, float* score_state, std::int64_t position,
               const float* a, const float* z, float* out) {
  update_token(p, kv_state, score_state, position, a, z);
  if ((position + 1) % p.ratio != 0) return false;
  pool_state(p, kv_state, score_state, out);
  if (p.coff() == 2) {
    const std::size_t half = static_cast<std::size_t>(p.ratio) * p.proj_width();
    std::memcpy(kv_state, kv_state + half, half * sizeof(float));
    std::memcpy(score_state, score_state + half, half * sizeof(float));
  }
  return true;
}

bool full_step(const CompressorParams& p, float* kv_state, float* score_state, std::int64_t position,
               const float* a, const float* z, float* out_row) {
  if (!pool_step(p, kv_state, score_state, position, a, z, out_row)) return false;
  compressor_finish_row(p, position / p.ratio, out_row);
  return true;
}
}  // namespace

void check_compressor_params(const CompressorParams& p) {
  KVC_ASSERT((p.ratio == 4 && p.overlap) || (p.ratio == 128 && !p.overlap),
             "compressor: ratio 4 with overlap or ratio 128 without");
  KVC_ASSERT((p.branch == CompressorBranch::Main && p.width == kHeadDim) ||
                 (p.branch == CompressorBranch::Indexer && p.width == kIndexerHeadDim && p.ratio == 4),
             "compressor: width must be 512 (main) or 128 (indexer, ratio 4)");
  KVC_ASSERT(p.ape != nullptr && p.norm_weight != nullptr && p.rope != nullptr,
             "compressor: ape, norm weight and RoPE table are required");
}

void compressor_reset_state(const CompressorParams& p, float* kv_state, float* score_state) {
  std::fill(kv_state, kv_state + p.state_floats(), 0.0f);
  std::fill(score_state, score_state + p.state_floats(), kNegInf);
}

std::size_t compressor_rows_emitted(std::uint32_t ratio, std::int64_t start, std::size_t count) {
  const std::int64_t end = start + static_cast<std::int64_t>(count);
  return static_cast<std::size_t>(end / ratio - start / ratio);
}

bool compressor_pool_step(const CompressorParams& p, float* kv_state, float* score_state,
                          std::int64_t position, const float* a, const float* z, float* out_pooled) {
  check_pooling_shape(p);
  KVC_ASSERT(position >= 0, "compressor_pool_step: negative position");
  return pool_step(p, kv_state, score_state, position, a, z, out_pooled);
}

void compressor_finish_row(const CompressorParams& p, std::int64_t group, float* row) {
  // RMSNorm sums eight lanes of squares and RoPE rotates the last 64 dims: a worked example's small width
  // (fine for pooling) would read and write outside the row.
  KVC_ASSERT(p.width % 8 == 0 && p.width >= kRopeDims && p.width <= kHeadDim,
             "compressor_finish_row: width must be a multiple of 8 in [64, 512]");
  KVC_ASSERT(p.norm_weight != nullptr && p.rope != nullptr, "compressor_finish_row: norm weight and RoPE table needed");
  const std::size_t d = p.width;
  // RMSNorm: x * rsqrt(mean(x^2) + eps), then the weight.
  float lanes[8] = {};
  for (std::size_t j = 0; j < d; j += 8) {
    for (std::size_t k = 0; k < 8; ++k) lanes[k] += row[j + k] * row[j + k];
  }
  const float ss = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  const float inv_rms = 1.0f / std::sqrt(ss / static_cast<float>(d) + p.norm_eps);
  for (std::size_t j = 0; j < d; ++j) row[j] = p.norm_weight[j] * (row[j] * inv_rms);
  RopeCosSin cs;
  rope_cos_sin(cs, *p.rope, group * p.ratio);
  rope_rotate(row + d - kRopeDims, cs, /*inverse=*/false);
  if (!p.simulate_rounding) return;
  if (p.branch == CompressorBranch::Main) {
    simulate_main_row(row);
  } else {
    simulate_indexer_row(row);
  }
}

bool compressor_decode_step(const CompressorParams& p, float* kv_state, float* score_state,
                            std::int64_t position, const float* a, const float* z, float* out_row) {
  check_compressor_params(p);
  KVC_ASSERT(position >= 0, "compressor_decode_step: negative position");
  return full_step(p, kv_state, score_state, position, a, z, out_row);
}

std::size_t compressor_prefill(const CompressorParams& p, float* kv_state, float* score_state,
                               std::int64_t start, std::size_t count, const float* a, const float* z,
                               float* out_rows) {
  check_compressor_params(p);
  KVC_ASSERT(start >= 0, "compressor_prefill: negative start");
  const std::size_t pw = p.proj_width();
  std::size_t emitted = 0;
  for (std::size_t k = 0; k < count; ++k) {
    const std::int64_t t = start + static_cast<std::int64_t>(k);
    if (full_step(p, kv_state, score_state, t, a + k * pw, z + k * pw, out_rows + emitted * p.width)) ++emitted;
  }
  return emitted;
}

// ---- oracle -------------------------------------------------------------------------------------------

std::vector<double> compressor_pooled_f64(const CompressorParams& p, std::int64_t group,
                                          std::span<const float> a_all, std::span<const float> z_all) {
  check_pooling_shape(p);
  const std::size_t d = p.width;
  const std::size_t pw = p.proj_width();
  const std::int64_t m = p.ratio;
  KVC_ASSERT(a_all.size() >= static_cast<std::size_t>((group + 1) * m) * pw && z_all.size() == a_all.size(),
             "compressor_pooled_f64: history shorter than the group");
  // The items pooled into row g: (token, first column of the half it contributes).
  std::vector<std::pair<std::int64_t, std::size_t>> items;
  if (p.overlap && group > 0) {
    for (std::int64_t i = 0; i < m; ++i) items.emplace_back((group - 1) * m + i, 0);
  }
  for (std::int64_t i = 0; i < m; ++i) items.emplace_back(group * m + i, p.overlap ? d : 0);
  std::vector<double> row(d, 0.0);
  for (std::size_t j = 0; j < d; ++j) {
    std::vector<double> score;
    for (const auto& [token, column] : items) {
      const std::size_t slot = static_cast<std::size_t>(token % m);
      score.push_back(static_cast<double>(z_all[static_cast<std::size_t>(token) * pw + column + j]) +
                      static_cast<double>(ape_at(p, slot, column + j)));
    }
    const double mx = *std::max_element(score.begin(), score.end());
    double denom = 0.0;
    for (double s : score) denom += std::exp(s - mx);
    double y = 0.0;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const auto& [token, column] = items[k];
      y += std::exp(score[k] - mx) / denom * static_cast<double>(a_all[static_cast<std::size_t>(token) * pw + column + j]);
    }
    row[j] = y;
  }
  return row;
}

std::vector<double> compressor_row_f64(const CompressorParams& p, std::int64_t group,
                                       std::span<const float> a_all, std::span<const float> z_all) {
  check_compressor_params(p);
  const std::size_t d = p.width;
  std::vector<double> row = compressor_pooled_f64(p, group, a_all, z_all);
  double ss = 0.0;
  for (double v : row) ss += v * v;
  const double inv_rms = 1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(p.norm_eps));
  for (std::size_t j = 0; j < d; ++j) row[j] = static_cast<double>(p.norm_weight[j]) * row[j] * inv_rms;
  rope_rotate_f64(std::span<double>(row).subspan(d - kRopeDims), group * p.ratio, *p.rope, /*inverse=*/false);
  if (p.simulate_rounding) {
    if (p.branch == CompressorBranch::Main) {
      simulate_main_row_f64(row);
    } else {
      simulate_indexer_row_f64(row);
    }
  }
  return row;
}

void compressor_state_f64(const CompressorParams& p, std::int64_t n, std::span<const float> a_all,
                          std::span<const float> z_all, float* kv_state, float* score_state) {
  check_pooling_shape(p);
  const std::size_t pw = p.proj_width();
  const std::int64_t m = p.ratio;
  const std::int64_t groups = n / m;
  const std::int64_t rem = n % m;
  KVC_ASSERT(a_all.size() >= static_cast<std::size_t>(n) * pw && z_all.size() >= static_cast<std::size_t>(n) * pw,
             "compressor_state_f64: history shorter than n");
  auto put = [&](std::size_t row, std::int64_t token) {
    for (std::size_t j = 0; j < pw; ++j) {
      if (token < 0) {
        kv_state[row * pw + j] = 0.0f;
        score_state[row * pw + j] = kNegInf;
      } else {
        const std::size_t slot = static_cast<std::size_t>(token % m);
        kv_state[row * pw + j] = a_all[static_cast<std::size_t>(token) * pw + j];
        score_state[row * pw + j] = z_all[static_cast<std::size_t>(token) * pw + j] + ape_at(p, slot, j);
      }
    }
  };
  const std::size_t base = static_cast<std::size_t>(p.coff() - 1) * p.ratio;
  for (std::int64_t i = 0; i < m; ++i) {
    const std::int64_t token = i < rem ? groups * m + i : (groups > 0 ? (groups - 1) * m + i : -1);
    put(base + static_cast<std::size_t>(i), token);
    if (p.coff() == 2) put(static_cast<std::size_t>(i), groups > 0 ? (groups - 1) * m + i : -1);
  }
}

}  // namespace kvcompact::dsv4
