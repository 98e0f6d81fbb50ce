// run_indexer_case, run_indexer_case_per_storage and run_topk_case (kernel_cases.hpp): indexer query preparation
// and scores bit for bit against the CPU fast path (and within 1e-5 of the float64 oracle), top-k indices identical
// to the CPU's (ties on purpose, NaN, +-0, +-inf, fewer rows than k, many chunks).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/dsv4_kernels.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/dsv4/attention.hpp"
#include "kvcompact/dsv4/fp_sim.hpp"
#include "kvcompact/dsv4/indexer.hpp"
#include "kvcompact/dsv4/rope.hpp"
#include "kvcompact/dsv4/storage.hpp"
#include "dsv4/indexer_head_sum.hpp"
#include "dsv4/math_dot.hpp"
#include "test_seed.hpp"

#include "kernel_cases.hpp"

namespace kvcompact::cuda::dsv4::kernel_cases {

namespace {

// FP4-grid values (e2m1 magnitudes times a power of two per 32-value block) with block scales spread over
// 2^-3 .. 2^0 and mostly positive: rows and prepared queries whose dot products fill the 22 significant bits the
// tensor-core paths allow (see row_check_16bit in src/cuda_dsv4/indexer_rows16.cuh) and stay positive through the ReLU.
std::vector<float> wide_span_fp4_values(std::mt19937_64& rng, std::size_t n) {
  const float e2m1[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  std::vector<float> v(n);
  float scale = 1.0f;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 32 == 0) scale = std::ldexp(1.0f, -static_cast<int>(rng() % 4));
    const float mag = e2m1[i % 32 == 0 ? 7 : rng() % 8];  // each block keeps its largest value
    v[i] = (rng() % 8 == 0 ? -mag : mag) * scale;
  }
  return v;
}

// The largest sum the 16-bit paths allow, with its lowest bit set: a key row of 127 values 6 (1.5 * 2^2) and one
// 1.5 * 2^-4 (the smallest magnitude the row check accepts, 2^(E-6) with E = 2, has its low bit at 2^(E-7)), and
// a query head of 127 values 6 and one 1.5 * 2^-3 (codes 96 and 3 at exponent 2^-4). Their dot, 127 * 36 +
// 0.28125 / 2^4 units, needs 21.2 of the 22 bits. Dim 0 holds the small values.
std::vector<float> max_span_values() {
  std::vector<float> v(128, 6.0f);
  v[0] = 0.09375f;
  return v;
}
std::vector<float> max_span_query_head() {
  std::vector<float> v(128, 6.0f);
  v[0] = 0.1875f;
  return v;
}

// A key row as the model makes it (Hadamard + FP4), encoded in `storage`, and the CPU's decode of it.
struct IndexerRows {
  std::vector<std::uint8_t> bytes;
  std::vector<float> decoded;  // [rows, 128]
  std::vector<bool> poisoned;  // rows given special values (poison_indexer_rows); empty: none
};

IndexerRows make_indexer_rows(std::mt19937_64& rng, std::size_t rows, kd::IndexerStorage storage, bool model_grid,
                              std::size_t distinct = 0, bool wide_span = false) {
  const std::size_t rb = kd::indexer_row_bytes(storage);
  IndexerRows out;
  out.bytes.resize(rows * rb);
  out.decoded.resize(rows * 128);
  std::uniform_real_distribution<float> mag(0.25f, 4.0f);
  std::vector<std::vector<float>> pool;
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<float> row;
    if (distinct > 0 && pool.size() >= distinct) {
      row = pool[rng() % distinct];
    } else {
      if (wide_span) {
        row = r % 101 == 0 ? max_span_values() : wide_span_fp4_values(rng, 128);
      } else {
        row = normal(rng, 128, mag(rng));
        if (model_grid) kd::simulate_indexer_row(row.data());
      }
      if (distinct > 0) pool.push_back(row);
    }
    std::span<std::uint8_t> dst(out.bytes.data() + r * rb, rb);
    EXPECT_TRUE(kd::encode_indexer_row(row, storage, dst).ok());
    EXPECT_TRUE(kd::decode_indexer_row(dst, storage, std::span<float>(out.decoded.data() + r * 128, 128)).ok());
  }
  return out;
}

// Writes one value the integer grid cannot hold exactly into every 7th row (NaN, +-infinity, a subnormal, the
// largest finite value; for FP8 also as the row scale, for MXFP4 as a block scale), and -0 into every 11th (the
// grid holds it), then decodes the rows again as the CPU does and marks them. Rows off the grid must take the
// scalar path.
void poison_indexer_rows(IndexerRows& keys, kd::IndexerStorage storage, std::mt19937_64& rng) {
  const std::size_t rb = kd::indexer_row_bytes(storage), rows = keys.bytes.size() / rb;
  const std::uint16_t bf16_specials[] = {0x7FC0, 0x7F80, 0xFF80, 0x0003, 0x7F7F};
  const float float_specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(), 0x1p-140f, 0x1p127f};
  const std::uint8_t e8m0_specials[] = {0xFF, 0x00, 0xFE};
  keys.poisoned.assign(rows, false);
  for (std::size_t r = 0; r < rows; ++r) {
    std::uint8_t* row = keys.bytes.data() + r * rb;
    const std::size_t d = rng() % 128, kind = (r / 7) % 5;
    if (r % 7 == 3) {
      switch (storage) {
        case kd::IndexerStorage::Bf16:
          std::memcpy(row + 2 * d, &bf16_specials[kind], 2);
          break;
        case kd::IndexerStorage::Fp8:
          if (kind < 2) row[d] = kind == 0 ? 0x7F : 0xFF;  // the two e4m3 NaN codes
          else std::memcpy(row + 128, &float_specials[kind], 4);
          if (kind == 0 && r % 2 == 1) std::memcpy(row + 128, &float_specials[r / 7 % 3], 4);
          break;
        case kd::IndexerStorage::Mxfp4:
          row[64 + d / 32] = e8m0_specials[kind % 3];
          break;
      }
    } else if (r % 11 == 5 && storage == kd::IndexerStorage::Bf16) {
      const std::uint16_t minus_zero = 0x8000;
      std::memcpy(row + 2 * d, &minus_zero, 2);
    } else {
      continue;
    }
    keys.poisoned[r] = true;
    EXPECT_TRUE(kd::decode_indexer_row(std::span<const std::uint8_t>(row, rb), storage,
                                       std::span<float>(keys.decoded.data() + r * 128, 128))
                    .ok());
  }
}

}  // namespace

void run_indexer_case(const IndexerCase& c) {
  arm_watchdog();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " case " + c.name);
  std::mt19937_64 rng(seed);
  const std::uint32_t count = static_cast<std::uint32_t>(c.positions.size());
  const std::uint32_t H = c.heads;
  std::vector<IndexerRows> keys;
  std::vector<DeviceBuffer> key_bufs;
  std::vector<TokenRows> tokens(count);
  std::uint32_t max_visible = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t vis = kd::visible_compressed_rows(4, c.positions[i]);
    max_visible = std::max<std::uint32_t>(max_visible, static_cast<std::uint32_t>(vis));
    keys.push_back(make_indexer_rows(rng, vis, c.storage, c.model_grid, c.distinct, c.wide_span));
    if (c.special_values) poison_indexer_rows(keys.back(), c.storage, rng);
    key_bufs.push_back(upload(keys.back().bytes));
    tokens[i].indexer_rows = key_bufs.back().data();
    tokens[i].position = c.positions[i];
  }
  std::vector<float> q_raw = normal(rng, std::size_t{count} * H * 128);
  for (std::uint32_t i = 0; i < count; ++i) {
    for (int z = 0; z < c.zero_heads && z < static_cast<int>(H); ++z) {
      std::fill_n(q_raw.begin() + (std::size_t{i} * H + static_cast<std::size_t>(z) * 3 % H) * 128, 128, 0.0f);
    }
  }
  std::vector<float> q_cpu = q_raw;
  for (std::uint32_t i = 0; i < count; ++i) kd::prepare_indexer_query(q_cpu.data() + std::size_t{i} * H * 128, H);
  if (c.wide_span) {  // handed over as prepared (see the case); head 0 of every token is the max-span head
    q_cpu = wide_span_fp4_values(rng, q_cpu.size());
    for (std::uint32_t i = 0; i < count; ++i) {
      const std::vector<float> head = max_span_query_head();
      std::copy(head.begin(), head.end(), q_cpu.begin() + std::size_t{i} * H * 128);
    }
  }
  std::vector<float> w = normal(rng, std::size_t{count} * H, 1.0f / std::sqrt(128.0f * 64.0f));
  for (auto& x : w) x *= c.weight_scale;

  DeviceBuffer d_tokens = upload(tokens);
  DeviceBuffer d_q = upload(c.prepared_input ? q_cpu : q_raw);
  DeviceBuffer d_w = upload(w);
  const std::uint64_t qws_bytes = indexer_query_workspace_bytes(count);
  DeviceBuffer d_qws = alloc(qws_bytes);
  const std::uint32_t stride = std::max<std::uint32_t>(max_visible, 1);
  DeviceBuffer d_scores = alloc(std::uint64_t{count} * stride * 4);
  DeviceBuffer d_fallback = upload(std::vector<unsigned long long>{0ull});
  DeviceBuffer d_idx = alloc(std::uint64_t{count} * c.k * 4);
  const std::uint64_t tws_bytes = topk_workspace_bytes(count, max_visible, c.k);
  DeviceBuffer d_tws = alloc(tws_bytes);

  check(indexer_prepare_queries(static_cast<const float*>(d_q.data()), count, H, c.prepared_input, d_qws.data(),
                                qws_bytes, nullptr),
        "indexer_prepare_queries");
  IndexerScoreArgs sa;
  sa.tokens = static_cast<const TokenRows*>(d_tokens.data());
  sa.count = count;
  sa.heads = H;
  sa.weights = static_cast<const float*>(d_w.data());
  sa.query_workspace = d_qws.data();
  sa.query_workspace_bytes = qws_bytes;
  sa.storage = c.storage;
  sa.max_visible = max_visible;
  sa.scores = static_cast<float*>(d_scores.data());
  sa.score_stride = stride;
  sa.fallback_rows = static_cast<unsigned long long*>(d_fallback.data());
  check(indexer_scores(sa, nullptr), "indexer_scores");
  TopkArgs ta;
  ta.scores = sa.scores;
  ta.score_stride = stride;
  ta.count = count;
  ta.tokens = sa.tokens;
  ta.ratio = 4;
  ta.max_rows = max_visible;
  ta.k = c.k;
  ta.out = static_cast<std::int32_t*>(d_idx.data());
  ta.out_stride = c.k;
  check(indexer_topk(ta, d_tws.data(), tws_bytes, nullptr), "indexer_topk");
  check(synchronize(), "synchronize");

  const auto scores = download<float>(d_scores, std::size_t{count} * stride);
  const auto idx = download<std::int32_t>(d_idx, std::size_t{count} * c.k);
  const auto fallback = download<unsigned long long>(d_fallback, 1)[0];
  // The prepared query itself: the workspace starts with the float query [tokens, 64, 128].
  const auto qf = download<float>(d_qws, std::size_t{count} * 64 * 128);
  std::size_t q_diff = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    for (std::size_t j = 0; j < std::size_t{H} * 128; ++j) {
      q_diff += bits(qf[std::size_t{i} * 64 * 128 + j]) != bits(q_cpu[std::size_t{i} * H * 128 + j]);
    }
  }
  EXPECT_EQ(q_diff, 0u) << "prepared query values differ from prepare_indexer_query";

  std::size_t score_diff = 0, index_diff = 0, rows_total = 0;
  double worst_rel = 0.0;
  kd::TopkScratch scratch;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t vis = keys[i].decoded.size() / 128;
    rows_total += vis;
    std::vector<float> cpu(vis);
    const float* qi = q_cpu.data() + std::size_t{i} * H * 128;
    const float* wi = w.data() + std::size_t{i} * H;
    kd::indexer_scores_contiguous(cpu.data(), qi, wi, keys[i].decoded.data(), vis, H, 128);
    const auto f64 = kd::indexer_scores_f64(std::span<const float>(qi, std::size_t{H} * 128),
                                            std::span<const float>(wi, H), keys[i].decoded, H, 128);
    for (std::size_t s = 0; s < vis; ++s) {
      const float g = scores[std::size_t{i} * stride + s];
      // (NaN scores need not have the CPU's payload: the top-k treats every NaN alike.)
      if (bits(g) != bits(cpu[s]) && !(std::isnan(g) && std::isnan(cpu[s]))) {
        if (score_diff < 5) {
          std::printf("[dsv4-kernels] score differs: token %u row %zu gpu %.9g cpu %.9g\n", i, s, g, cpu[s]);
        }
        ++score_diff;
      }
      double bound = 0.0;
      for (std::uint32_t h = 0; h < H; ++h) {
        double dot = 0.0;
        for (int d = 0; d < 128; ++d) dot += static_cast<double>(qi[h * 128 + d]) * keys[i].decoded[s * 128 + d];
        bound += std::fabs(wi[h]) * std::max(dot, 0.0);
      }
      // A poisoned row's float arithmetic may overflow or lose bits in subnormals: there the CPU's bits are the
      // whole check.
      if (!keys[i].poisoned.empty() && keys[i].poisoned[s]) continue;
      const double err = std::fabs(static_cast<double>(g) - f64[s]);
      if (bound > 0) worst_rel = std::max(worst_rel, err / bound);
      EXPECT_LE(err, 1e-5 * bound + 1e-30) << "token " << i << " row " << s;
    }
    std::vector<std::int32_t> want(c.k);
    kd::indexer_topk(want.data(), c.k, cpu.data(), vis, scratch);
    for (std::uint32_t j = 0; j < c.k; ++j) {
      if (idx[std::size_t{i} * c.k + j] != want[j]) {
        if (index_diff < 5) {
          std::printf("[dsv4-kernels] index differs: token %u slot %u gpu %d cpu %d\n", i, j,
                      idx[std::size_t{i} * c.k + j], want[j]);
        }
        ++index_diff;
      }
    }
  }
  std::printf("[dsv4-kernels] indexer %s: %u tokens, %zu rows, scores differing from CPU bits %zu, max err vs f64 "
              "%.3g of sum|terms|, top-%u slots differing %zu, scalar-path rows %llu (seed %llu)\n",
              c.name.c_str(), count, rows_total, score_diff, worst_rel, c.k, index_diff, fallback,
              static_cast<unsigned long long>(seed));
  EXPECT_EQ(score_diff, 0u);
  EXPECT_EQ(index_diff, 0u);
  const bool some = c.fallback == IndexerCase::Fallback::Some || (c.fallback == IndexerCase::Fallback::ByGrid && !c.model_grid);
  if (c.fallback == IndexerCase::Fallback::WholeTokens) {
    // The count must be the visible rows of some subset of the tokens (sums over all subsets; few tokens here).
    ASSERT_LE(count, 16u);
    bool whole = false;
    for (std::uint32_t subset = 0; subset < (1u << count) && !whole; ++subset) {
      std::size_t rows = 0;
      for (std::uint32_t i = 0; i < count; ++i) {
        if (subset >> i & 1u) rows += kd::visible_compressed_rows(4, c.positions[i]);
      }
      whole = rows == fallback;
    }
    EXPECT_TRUE(whole) << fallback << " scalar-path rows are not whole tokens";
  } else if (!some) {
    EXPECT_EQ(fallback, 0u) << "these rows must take the tensor-core path";
  } else if (rows_total > 0) {
    EXPECT_GT(fallback, 0u) << "these rows must take the scalar path";
  }
}

// run_indexer_case for each indexer storage, named prefix + the storage's name.
void run_indexer_case_per_storage(IndexerCase c, const std::string& prefix) {
  for (auto st : {kd::IndexerStorage::Mxfp4, kd::IndexerStorage::Fp8, kd::IndexerStorage::Bf16}) {
    c.storage = st;
    c.name = prefix + std::string(kd::indexer_storage_name(st));
    run_indexer_case(c);
  }
}

void run_topk_case(const std::string& name, const std::vector<std::vector<float>>& per_token, std::uint32_t k) {
  arm_watchdog();
  const std::uint32_t count = static_cast<std::uint32_t>(per_token.size());
  std::uint32_t max_rows = 0;
  for (const auto& s : per_token) max_rows = std::max<std::uint32_t>(max_rows, static_cast<std::uint32_t>(s.size()));
  const std::uint32_t stride = std::max<std::uint32_t>(max_rows, 1);
  std::vector<float> flat(std::size_t{count} * stride, 0.0f);
  std::vector<std::uint32_t> counts(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    std::copy(per_token[i].begin(), per_token[i].end(), flat.begin() + std::size_t{i} * stride);
    counts[i] = static_cast<std::uint32_t>(per_token[i].size());
  }
  DeviceBuffer d_scores = upload(flat), d_counts = upload(counts);
  DeviceBuffer d_idx = alloc(std::uint64_t{count} * k * 4);
  const std::uint64_t ws = topk_workspace_bytes(count, max_rows, k);
  DeviceBuffer d_ws = alloc(ws);
  TopkArgs ta;
  ta.scores = static_cast<const float*>(d_scores.data());
  ta.score_stride = stride;
  ta.count = count;
  ta.counts = static_cast<const std::uint32_t*>(d_counts.data());
  ta.max_rows = max_rows;
  ta.k = k;
  ta.out = static_cast<std::int32_t*>(d_idx.data());
  ta.out_stride = k;
  check(indexer_topk(ta, d_ws.data(), ws, nullptr), "indexer_topk");
  check(synchronize(), "synchronize");
  const auto idx = download<std::int32_t>(d_idx, std::size_t{count} * k);
  kd::TopkScratch scratch;
  std::size_t diff = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::vector<std::int32_t> want(k);
    kd::indexer_topk(want.data(), k, per_token[i].data(), per_token[i].size(), scratch);
    for (std::uint32_t j = 0; j < k; ++j) {
      if (idx[std::size_t{i} * k + j] != want[j]) {
        if (diff < 5) {
          std::printf("[dsv4-kernels] topk %s: token %u slot %u gpu %d cpu %d\n", name.c_str(), i, j,
                      idx[std::size_t{i} * k + j], want[j]);
        }
        ++diff;
      }
    }
  }
  std::printf("[dsv4-kernels] topk %s: %u tokens, max rows %u, k %u, slots differing %zu\n", name.c_str(), count,
              max_rows, k, diff);
  EXPECT_EQ(diff, 0u) << name;
}

}  // namespace kvcompact::cuda::dsv4::kernel_cases
