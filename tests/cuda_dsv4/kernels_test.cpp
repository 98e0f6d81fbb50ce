// The DeepSeek-V4 CUDA kernels against the CPU math on fresh random inputs (seed printed): indexer query
// preparation and scores bit for bit against the CPU fast path (and within 1e-5 of the float64 oracle),
// top-k indices identical to the CPU's (ties on purpose, NaN, +-0, +-inf, fewer rows than k, many chunks),
// sparse attention within 2e-3 of the float64 oracle (64 / 128 heads, window only, ratio 4 / 128, BF16 and
// FP8 rows, decode batches with different positions, a prefill chunk reading its own rows). Every test skips
// without a CUDA device. `[dsv4-kernels]` lines report the measured differences.
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

namespace kvcompact::cuda::dsv4 {
namespace {

namespace kd = kvcompact::dsv4;

#define SKIP_WITHOUT_GPU()                                                                        \
  do {                                                                                            \
    if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)"; \
  } while (0)

// A kernel that never returns would stall the whole GPU run: the first kernel test arms a watchdog that ends
// the process after DSV4_KERNELS_WATCHDOG_S seconds (default 600; 0 disables it).
void arm_watchdog() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("DSV4_KERNELS_WATCHDOG_S");
    const int secs = env != nullptr ? std::atoi(env) : 600;
    if (secs <= 0) return;
    std::thread([secs] {
      std::this_thread::sleep_for(std::chrono::seconds(secs));
      std::fprintf(stderr, "[dsv4-kernels] watchdog: still running after %d s, ending the process\n", secs);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(3);
    }).detach();
  });
}

using kvcompact::testing_support::fresh_seed;

template <typename T>
T take(Result<T>&& r) {
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

void check(const Status& st, const char* what) {
  ASSERT_TRUE(st.ok()) << what << ": " << st.error().to_string();
  if (std::getenv("DSV4_KERNELS_TRACE") != nullptr) {
    const Status s2 = synchronize();
    std::printf("[dsv4-kernels] trace: %s done (%s)\n", what, s2.ok() ? "ok" : s2.error().to_string().c_str());
    std::fflush(stdout);
  }
}

DeviceBuffer alloc(std::uint64_t bytes) {
  auto r = DeviceBuffer::allocate(std::max<std::uint64_t>(bytes, 16));
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b = alloc(v.size() * sizeof(T));
  if (!v.empty()) {
    const Status st = b.upload(v.data(), v.size() * sizeof(T));
    EXPECT_TRUE(st.ok()) << st.error().to_string();
  }
  return b;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& b, std::size_t n) {
  std::vector<T> v(n);
  if (n > 0) {
    const Status st = b.download(v.data(), n * sizeof(T));
    EXPECT_TRUE(st.ok()) << st.error().to_string();
  }
  return v;
}

std::vector<float> normal(std::mt19937_64& rng, std::size_t n, float sigma = 1.0f) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ---- indexer ------------------------------------------------------------------------------------------

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

struct IndexerCase {
  std::string name;
  kd::IndexerStorage storage = kd::IndexerStorage::Mxfp4;
  std::vector<std::int64_t> positions;  // one token per sequence (own indexer rows each)
  std::uint32_t heads = 64;
  std::uint32_t k = 512;
  bool model_grid = true;       // keys on the FP4 grid (model data); false: arbitrary values (scalar path)
  bool prepared_input = false;  // hand the CPU-prepared query to the GPU
  std::size_t distinct = 0;     // > 0: keys drawn from this many distinct rows (ties)
  int zero_heads = 0;           // heads whose raw query is 0 (ReLU(0), zero integer rows)
  float weight_scale = 1.0f;    // power of two times the head weights (extreme scales reach the scalar path)
  bool special_values = false;  // poison_indexer_rows: NaN, infinities, subnormals and -0 in some rows
  bool wide_span = false;       // wide_span_fp4_values for the rows and the (prepared) query
  // Scalar-path rows expected: by the key grid (none for model rows), none, some, or whole tokens only (0 or more
  // tokens with all their rows: a token whose w_h 2^fq_h is not exact for some head takes the scalar path, which
  // for tiny weights depends on the draw).
  enum class Fallback { ByGrid, None, Some, WholeTokens } fallback = Fallback::ByGrid;
};

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

// ---- top-k alone on constructed scores --------------------------------------------------------------------

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

// ---- attention ----------------------------------------------------------------------------------------

struct AttnCase {
  std::string name;
  kd::RowStorage storage = kd::RowStorage::Bf16;
  std::uint32_t ratio = 4;
  std::uint32_t heads = 64;
  std::vector<std::int64_t> positions;  // decode: one token per sequence
  bool prefill = false;                 // prefill: positions are consecutive tokens of one sequence
  std::uint32_t topk = 512;
  bool with_sink = true;
  float q_scale = 1.0f;
  bool q_bf16 = false;     // the query rounded to bf16 values (the model's activations)
  float row_growth = 0.0f;  // compressed row g at 1 + g * row_growth times the model's scale
  std::uint32_t check_every = 1;  // the float64 oracle checks tokens i % check_every == 0 and the last
};

// One sequence's rows: float rows by position (window) and by compressed slot, encoded into device buffers.
struct SeqRows {
  std::map<std::int64_t, std::vector<float>> window;  // decoded values by position
  std::vector<std::vector<float>> compressed;         // decoded values by slot
  std::vector<std::uint8_t> ring_bytes, chunk_bytes, comp_bytes;
};

std::vector<float> model_attention_row(std::mt19937_64& rng, kd::RowStorage storage, std::vector<std::uint8_t>& bytes,
                                       std::size_t at, float scale = 1.0f) {
  std::vector<float> row = normal(rng, 512);
  kd::simulate_main_row(row.data());
  for (float& x : row) x *= scale;
  const std::size_t rb = kd::attention_row_bytes(storage);
  std::span<std::uint8_t> dst(bytes.data() + at * rb, rb);
  EXPECT_TRUE(kd::encode_attention_row(row, storage, dst).ok());
  std::vector<float> dec(512);
  EXPECT_TRUE(kd::decode_attention_row(dst, storage, dec).ok());
  return dec;
}

void run_attention_case(const AttnCase& c) {
  arm_watchdog();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " case " + c.name);
  std::mt19937_64 rng(seed);
  const std::uint32_t count = static_cast<std::uint32_t>(c.positions.size());
  const std::uint32_t H = c.heads;
  const std::size_t rb = kd::attention_row_bytes(c.storage);
  const std::size_t nseq = c.prefill ? 1 : count;
  std::vector<SeqRows> seqs(nseq);
  std::vector<DeviceBuffer> bufs;
  std::vector<TokenRows> tokens(count);
  std::vector<std::int32_t> indices(std::size_t{count} * std::max<std::uint32_t>(c.topk, 1), -1);
  std::uint32_t max_rows = 0;
  for (std::size_t sq = 0; sq < nseq; ++sq) {
    SeqRows& s = seqs[sq];
    const std::int64_t first = c.prefill ? c.positions.front() : c.positions[sq];
    const std::int64_t last = c.prefill ? c.positions.back() : c.positions[sq];
    const std::int64_t chunk_start = first;  // decode: the token's own row is its "chunk"
    // Ring: positions [max(0, first - 127), first) at slot p mod 128; chunk: positions [first, last].
    s.ring_bytes.assign(128 * rb, 0xAB);  // garbage in unused slots must never be read
    for (std::int64_t p = std::max<std::int64_t>(0, first - 127); p < first; ++p) {
      s.window[p] = model_attention_row(rng, c.storage, s.ring_bytes, static_cast<std::size_t>(p % 128));
    }
    s.chunk_bytes.assign(static_cast<std::size_t>(last - first + 1) * rb, 0);
    for (std::int64_t p = first; p <= last; ++p) {
      s.window[p] = model_attention_row(rng, c.storage, s.chunk_bytes, static_cast<std::size_t>(p - first));
    }
    const std::size_t ncomp = c.ratio == 0 ? 0 : kd::visible_compressed_rows(c.ratio, last);
    s.comp_bytes.assign(std::max<std::size_t>(ncomp, 1) * rb, 0);
    for (std::size_t g = 0; g < ncomp; ++g) {
      const float scale = 1.0f + static_cast<float>(g) * c.row_growth;
      s.compressed.push_back(model_attention_row(rng, c.storage, s.comp_bytes, g, scale));
    }
    bufs.push_back(upload(s.ring_bytes));
    const void* ring = bufs.back().data();
    bufs.push_back(upload(s.chunk_bytes));
    const void* chunk = bufs.back().data();
    bufs.push_back(upload(s.comp_bytes));
    const void* comp = bufs.back().data();
    for (std::uint32_t i = 0; i < count; ++i) {
      if (!c.prefill && i != sq) continue;
      tokens[i].window_ring = ring;
      tokens[i].chunk_rows = chunk;
      tokens[i].chunk_start = chunk_start;
      tokens[i].compressed_rows = comp;
      tokens[i].position = c.positions[i];
      tokens[i].ring_capacity = 128;
    }
  }
  // Ratio 4: a random selection (distinct slots, random order) of min(topk, visible) rows, then -1.
  for (std::uint32_t i = 0; i < count; ++i) {
    if (c.ratio == 4) {
      const std::size_t vis = kd::visible_compressed_rows(4, c.positions[i]);
      std::vector<std::int32_t> perm(vis);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      const std::size_t kk = std::min<std::size_t>(c.topk, vis);
      for (std::size_t j = 0; j < kk; ++j) indices[std::size_t{i} * c.topk + j] = perm[j];
    }
    max_rows = std::max<std::uint32_t>(
        max_rows, static_cast<std::uint32_t>(kd::attention_row_count(c.ratio, c.positions[i], c.topk)));
  }
  std::vector<float> q = normal(rng, std::size_t{count} * H * 512, c.q_scale);
  if (c.q_bf16) {
    for (float& x : q) x = kvcompact::bf16_to_f32(kvcompact::f32_to_bf16(x));
  }
  std::vector<float> sink = normal(rng, H, 1.0f);
  const kd::RopeFrequencies freqs = kd::make_rope_frequencies(kd::rope_config_for_ratio(c.ratio));

  DeviceBuffer d_tokens = upload(tokens), d_q = upload(q), d_sink = upload(sink), d_idx = upload(indices);
  DeviceBuffer d_out = alloc(std::uint64_t{count} * H * 512 * 4);
  check(d_out.fill(0xFF), "poison the output");  // (NaN: a token the kernels leave unwritten cannot pass)
  const std::uint64_t ws = attention_workspace_bytes(count, H, max_rows);
  DeviceBuffer d_ws = alloc(ws);
  AttentionArgs a;
  a.tokens = static_cast<const TokenRows*>(d_tokens.data());
  a.count = count;
  a.heads = H;
  a.q = static_cast<const float*>(d_q.data());
  a.sink = c.with_sink ? static_cast<const float*>(d_sink.data()) : nullptr;
  a.storage = c.storage;
  a.ratio = c.ratio;
  a.indices = c.ratio == 4 ? static_cast<const std::int32_t*>(d_idx.data()) : nullptr;
  a.index_stride = c.topk;
  a.index_topk = c.topk;
  for (std::size_t i = 0; i < 32; ++i) a.inv_freq[i] = freqs.inv_freq[i];
  a.max_rows = max_rows;
  a.out = static_cast<float*>(d_out.data());
  check(sparse_attention(a, d_ws.data(), ws, nullptr), "sparse_attention");
  check(synchronize(), "synchronize");
  const auto out = download<float>(d_out, std::size_t{count} * H * 512);
  // Every token is written (finite); the oracle checks every check_every-th from an offset the fresh seed picks.
  std::size_t unwritten = 0;
  for (float x : out) unwritten += !std::isfinite(x);
  EXPECT_EQ(unwritten, 0u) << "output values left unwritten or non-finite";
  const std::uint32_t offset = static_cast<std::uint32_t>(seed % c.check_every);

  const std::vector<float> no_sink(H, -std::numeric_limits<float>::infinity());
  double worst = 0.0;
  for (std::uint32_t i = 0; i < count; ++i) {
    if ((i + offset) % c.check_every != 0 && i + 1 != count) continue;
    const SeqRows& s = seqs[c.prefill ? 0 : i];
    const std::int64_t t = c.positions[i];
    std::vector<const float*> rows;
    for (std::int64_t p : kd::window_positions(t)) rows.push_back(s.window.at(p).data());
    if (c.ratio == 4) {
      for (std::uint32_t j = 0; j < c.topk; ++j) {
        const std::int32_t g = indices[std::size_t{i} * c.topk + j];
        if (g >= 0) rows.push_back(s.compressed[static_cast<std::size_t>(g)].data());
      }
    } else if (c.ratio == 128) {
      const std::size_t vis = kd::visible_compressed_rows(128, t);
      for (std::size_t g = 0; g < vis; ++g) rows.push_back(s.compressed[g].data());
    }
    ASSERT_EQ(rows.size(), kd::attention_row_count(c.ratio, t, c.topk));
    const auto ref = kd::sparse_attention_f64(std::span<const float>(q.data() + std::size_t{i} * H * 512, std::size_t{H} * 512),
                                              H, rows, c.with_sink ? std::span<const float>(sink) : std::span<const float>(no_sink),
                                              &freqs, t);
    double scale = 0.0, err = 0.0;
    for (std::size_t j = 0; j < ref.size(); ++j) {
      scale = std::max(scale, std::fabs(ref[j]));
      const double g = out[std::size_t{i} * H * 512 + j];
      err = std::isfinite(g) ? std::max(err, std::fabs(g - ref[j])) : std::numeric_limits<double>::infinity();
    }
    const double rel = err / std::max(scale, 1e-30);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 2e-3) << "token " << i << " position " << t << " rows " << rows.size() << " max|ref| " << scale;
  }
  std::printf("[dsv4-kernels] attention %s: %s rows, ratio %u, %u heads, %u tokens, max rows %u, max err %.3g of "
              "max|out| (seed %llu)\n",
              c.name.c_str(), std::string(kd::row_storage_name(c.storage)).c_str(), c.ratio, H, count, max_rows, worst,
              static_cast<unsigned long long>(seed));
}

// ---- suites -------------------------------------------------------------------------------------------

TEST(CudaDsv4KernelsSmall, IndexerScoresAndTopkTiny) {
  SKIP_WITHOUT_GPU();
  IndexerCase c;
  c.name = "small";
  c.positions = {3, 42, 250};
  c.k = 16;
  c.storage = kd::IndexerStorage::Mxfp4;
  run_indexer_case(c);
  // Every storage's path under the sanitizers: two tiles (one partial) of grid rows, and rows with NaN,
  // infinities and subnormals.
  IndexerCase tiles = c;
  tiles.positions = {300, 42};
  run_indexer_case_per_storage(tiles, "small-");
  tiles.special_values = true;
  tiles.fallback = IndexerCase::Fallback::Some;
  run_indexer_case_per_storage(tiles, "small-special-");
  c.name = "small-offgrid-bf16";
  c.storage = kd::IndexerStorage::Bf16;
  c.model_grid = false;
  c.positions = {7, 40};
  run_indexer_case(c);
}

TEST(CudaDsv4KernelsSmall, TopkTiny) {
  SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  run_topk_case("tiny", {{1.0f, nan, 2.0f, 2.0f, -0.0f, 0.0f, -inf, inf, 1.0f}, {5.0f}, {}}, 4);
}

TEST(CudaDsv4KernelsSmall, AttentionTiny) {
  SKIP_WITHOUT_GPU();
  AttnCase c;
  c.name = "small";
  c.heads = 16;
  c.topk = 8;
  c.ratio = 4;
  c.positions = {50, 5};
  run_attention_case(c);
  c.name = "small-fp8-hca";
  c.storage = kd::RowStorage::Fp8;
  c.ratio = 128;
  c.positions = {300};
  run_attention_case(c);
  // 64 heads over a short row list: blocks of 16 heads (h0 = 16, 32, 48), under the sanitizers too.
  c.name = "small-64-heads";
  c.storage = kd::RowStorage::Bf16;
  c.heads = 64;
  c.ratio = 4;
  c.positions = {50, 5};
  run_attention_case(c);
}

// Long row lists: a ratio-128 token at 1M context (8320 rows in 130 splits: the merge's 16 split warps per
// quarter of the dims, two of them taking a second round of loads), then two tokens (65 splits, of which the token
// at 300000 uses 20: 8 split warps per half of the dims, one with a second round), under the sanitizers too.
TEST(CudaDsv4KernelsSmall, AttentionManySplits) {
  SKIP_WITHOUT_GPU();
  // The cases must reach that path: at least 64 splits of 64 heads x 512 floats per token (64-head blocks, so the
  // warpgroup-MMA split kernel).
  EXPECT_GE(attention_workspace_bytes(1, 64, 8320), std::uint64_t{64} * 64 * 512 * 4);
  EXPECT_GE(attention_workspace_bytes(2, 64, 8320), std::uint64_t{2} * 64 * 64 * 512 * 4);
  AttnCase c;
  c.name = "many-splits";
  c.ratio = 128;
  c.positions = {1048575};
  run_attention_case(c);
  c.positions = {300000, 1048575};
  run_attention_case(c);
  // FP8 rows in 64-head blocks (the warpgroup-MMA kernel's FP8 variant), so the sanitizers see it too.
  c.name = "many-splits-fp8";
  c.storage = kd::RowStorage::Fp8;
  run_attention_case(c);
}

// A prefill chunk's plan: one split per token in 64-head blocks, so the warpgroup kernel writes the output itself
// (normalised, sink, inverse RoPE; no merge). Both row formats, window-only and ratio-4 lists, with and without
// the sink, under the sanitizers too.
TEST(CudaDsv4KernelsSmall, AttentionDirectOutput) {
  SKIP_WITHOUT_GPU();
  // 140 tokens: more 16- or 32-head blocks than multiprocessors, so 64-head blocks; and one split each, so no
  // workspace (the plan's direct output).
  EXPECT_EQ(attention_workspace_bytes(140, 64, 192), 0u);
  EXPECT_EQ(attention_workspace_bytes(140, 64, 128), 0u);
  for (auto st : {kd::RowStorage::Bf16, kd::RowStorage::Fp8}) {
    AttnCase c;
    c.storage = st;
    c.prefill = true;
    c.check_every = 7;
    for (std::int64_t t = 1000; t < 1140; ++t) c.positions.push_back(t);
    c.name = "direct-window";
    c.ratio = 0;
    run_attention_case(c);
    c.name = "direct-csa-no-sink";
    c.ratio = 4;
    c.topk = 64;
    c.with_sink = false;
    run_attention_case(c);
  }
}

// The attention's split plan, seen through the workspace it sizes: per token, splits x 64 heads x (512 floats, then
// max and sum), each array 256-byte aligned. The counts are those of 132 multiprocessors (the H200, and the
// fallback without a device), so CI checks them too.
TEST(CudaDsv4KernelsArgs, SplitPlanOfTheDecodeBenchmark) {
  if (device_count() > 0) {
    const auto props = device_properties(0);
    if (!props.ok() || props->multiprocessors != 132) GTEST_SKIP() << "the pinned plans are for 132 multiprocessors";
  }
  auto ws_heads = [](std::uint64_t heads, std::uint64_t count, std::uint64_t splits) {
    const std::uint64_t parts = count * heads * splits;
    auto align256 = [](std::uint64_t x) { return (x + 255) / 256 * 256; };
    return align256(parts * 512 * 4) + align256(parts * 2 * 4);
  };
  auto ws = [&](std::uint64_t count, std::uint64_t splits) { return ws_heads(64, count, splits); };
  auto ws16 = [&](std::uint64_t count, std::uint64_t splits) { return ws_heads(16, count, splits); };
  EXPECT_EQ(attention_workspace_bytes(8, 64, 8320), ws(8, 15));      // 1M, ratio 128: 15 splits of 9 tiles, one wave
  EXPECT_EQ(attention_workspace_bytes(8, 64, 2176), ws(8, 12));      // 256K, ratio 128: 12 splits of 3 tiles
  EXPECT_EQ(attention_workspace_bytes(8, 64, 640), ws(8, 10));       // ratio 4: one tile per split
  EXPECT_EQ(attention_workspace_bytes(1, 64, 8320), ws(1, 130));     // batch 1: one tile per split
  EXPECT_EQ(attention_workspace_bytes(4096, 64, 640), 0u);  // a prefill chunk: one split per token, written directly
  EXPECT_EQ(attention_workspace_bytes(4096, 16, 640), ws16(4096, 1));  // (16 heads: the mma.sync kernel and the merge)
  // A huge row bound is planned at once (at most 4096 candidates) and within 4096 splits.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_LE(attention_workspace_bytes(1, 64, 0xFFFFFFFFu), ws(1, 4096));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

// Host-side argument checks: no device needed (they fail before any CUDA call), so CI runs them too.
TEST(CudaDsv4KernelsArgs, InvalidArgumentsAreRejected) {
  EXPECT_EQ(topk_max_rows(512), 0x7FFFFFFFu);
  EXPECT_EQ(topk_max_rows(2048), 0x7FFFFFFFu);
  EXPECT_EQ(topk_max_rows(0), 0u);
  EXPECT_EQ(topk_max_rows(4096), 0u);
  alignas(16) static float dummy[64];
  auto code = [](const Status& st) { return st.ok() ? ErrorCode::Internal : st.error().code; };
  EXPECT_EQ(code(indexer_prepare_queries(dummy, 1, 65, false, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  EXPECT_EQ(code(indexer_prepare_queries(nullptr, 1, 64, false, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  EXPECT_EQ(code(indexer_prepare_queries(dummy + 1, 1, 64, false, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  EXPECT_EQ(code(indexer_prepare_queries(dummy, 2, 64, false, dummy, 16, nullptr)), ErrorCode::InvalidArgument);
  EXPECT_TRUE(indexer_prepare_queries(dummy, 0, 64, false, nullptr, 0, nullptr).ok());  // nothing to do
  IndexerScoreArgs sa;
  sa.count = 1;
  sa.heads = 0;
  EXPECT_EQ(code(indexer_scores(sa, nullptr)), ErrorCode::InvalidArgument);
  sa.heads = 64;
  EXPECT_EQ(code(indexer_scores(sa, nullptr)), ErrorCode::InvalidArgument);  // null pointers
  TopkArgs ta;
  ta.count = 1;
  ta.k = 0;
  EXPECT_EQ(code(indexer_topk(ta, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  ta.k = 512;
  ta.max_rows = 0x80000000u;
  EXPECT_EQ(code(indexer_topk(ta, dummy, 1 << 20, nullptr)), ErrorCode::Unsupported);
  ta.max_rows = 1000;
  EXPECT_EQ(code(indexer_topk(ta, nullptr, 0, nullptr)), ErrorCode::InvalidArgument);  // no scores / out
  AttentionArgs aa;
  aa.count = 1;
  aa.heads = 20;
  EXPECT_EQ(code(sparse_attention(aa, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  aa.heads = 64;
  aa.ratio = 8;
  EXPECT_EQ(code(sparse_attention(aa, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  aa.ratio = 4;  // tokens / q / out missing
  EXPECT_EQ(code(sparse_attention(aa, dummy, 1 << 20, nullptr)), ErrorCode::InvalidArgument);
  // A plan with partials (one token over 640 rows: 10 splits) and no workspace, or too small a one.
  aa.tokens = reinterpret_cast<const TokenRows*>(dummy);
  aa.q = dummy;
  aa.out = dummy;
  aa.indices = reinterpret_cast<const std::int32_t*>(dummy);
  aa.index_stride = 512;
  aa.max_rows = 640;
  ASSERT_GT(attention_workspace_bytes(1, 64, 640), 0u);
  auto workspace_error = [](const Status& st) {
    return !st.ok() && st.error().code == ErrorCode::InvalidArgument &&
           st.error().message.find("workspace of") != std::string::npos;
  };
  EXPECT_TRUE(workspace_error(sparse_attention(aa, nullptr, 0, nullptr)));
  EXPECT_TRUE(workspace_error(sparse_attention(aa, dummy, attention_workspace_bytes(1, 64, 640) - 1, nullptr)));
  // More tokens than a call's grid holds, or a row bound the 32-bit split plan cannot hold: typed errors before
  // any launch (otherwise an untyped CUDA error, or a split of 2^32 rows wrapped to 0 rows and a silent result).
  auto error_says = [](const Status& st, ErrorCode expected, const std::string& words) {
    return !st.ok() && st.error().code == expected && st.error().message.find(words) != std::string::npos;
  };
  AttentionArgs many = aa;
  many.count = kMaxTokensPerCall + 1;
  EXPECT_TRUE(error_says(sparse_attention(many, dummy, 1 << 20, nullptr), ErrorCode::InvalidArgument,
                         "tokens per call"));
  AttentionArgs huge = aa;
  for (const std::uint32_t max_rows : {kMaxAttentionRows + 1, 0xFFFFFFFFu}) {
    huge.max_rows = max_rows;
    EXPECT_TRUE(error_says(sparse_attention(huge, dummy, 1 << 20, nullptr), ErrorCode::Unsupported, "exceeds the limit"));
  }
  IndexerScoreArgs many_scores;
  many_scores.count = kMaxTokensPerCall + 1;
  many_scores.tokens = reinterpret_cast<const TokenRows*>(dummy);
  many_scores.weights = dummy;
  many_scores.query_workspace = dummy;
  many_scores.scores = dummy;
  EXPECT_TRUE(error_says(indexer_scores(many_scores, nullptr), ErrorCode::InvalidArgument, "tokens per call"));
  // A query workspace smaller than its count needs (say, prepared for fewer tokens): refused before any launch.
  IndexerScoreArgs small_workspace = many_scores;
  small_workspace.count = 3;
  small_workspace.query_workspace_bytes = indexer_query_workspace_bytes(3) - 1;
  EXPECT_TRUE(error_says(indexer_scores(small_workspace, nullptr), ErrorCode::InvalidArgument,
                         "query workspace of"));
  ASSERT_LT(indexer_query_workspace_bytes(2), indexer_query_workspace_bytes(3));
  small_workspace.query_workspace_bytes = indexer_query_workspace_bytes(2);
  EXPECT_TRUE(error_says(indexer_scores(small_workspace, nullptr), ErrorCode::InvalidArgument,
                         "query workspace of"));
}

// The CPU half of the exactness argument (docs/cuda-dsv4-kernels.md), checked on the CPU alone: for model
// data (Hadamard + FP4 queries and keys) the CPU's float32 dot equals the exact dot product, and its scores
// equal the head sum of exact dots in the CPU's order (head_block_sum, then + 0) — which is what the tensor-core
// scorer computes.
TEST(CudaDsv4KernelsArgs, CpuIndexerDotIsExactOnModelData) {
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::size_t H = 64, rows = 300;  // (one block of heads: head_block_sum)
  std::vector<float> q = normal(rng, H * 128, 1.0f);
  kd::prepare_indexer_query(q.data(), H);
  std::uniform_real_distribution<float> mag(0.01f, 100.0f);
  std::vector<float> keys;
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<float> k = normal(rng, 128, mag(rng));
    kd::simulate_indexer_row(k.data());
    keys.insert(keys.end(), k.begin(), k.end());
  }
  const std::vector<float> w = normal(rng, H, 0.01f);
  std::vector<float> scores(rows);
  kd::indexer_scores_contiguous(scores.data(), q.data(), w.data(), keys.data(), rows, H, 128);
  std::size_t inexact = 0, differ = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    float terms[64];
    for (std::size_t h = 0; h < H; ++h) {
      double exact = 0.0;  // products and sums of FP4-grid values are exact in double here
      for (std::size_t i = 0; i < 128; ++i) exact += static_cast<double>(q[h * 128 + i]) * keys[r * 128 + i];
      const float as_float = static_cast<float>(exact);
      inexact += static_cast<double>(as_float) != exact;
      differ += bits(kd::detail::dot_f32(&q[h * 128], &keys[r * 128], 128)) != bits(as_float);
      terms[h] = w[h] * std::max(as_float, 0.0f);
    }
    const float total = kd::detail::head_block_sum(terms) + 0.0f;
    differ += bits(total) != bits(scores[r]);
  }
  std::printf("[dsv4-kernels] cpu exactness: %zu dots not representable, %zu values differing (seed %llu)\n", inexact,
              differ, static_cast<unsigned long long>(seed));
  EXPECT_EQ(inexact, 0u);
  EXPECT_EQ(differ, 0u);
}

TEST(CudaDsv4Kernels, IndexerMatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  IndexerCase decode;
  decode.positions = {0, 3, 129, 2047, 2048, 9001, 40003};
  decode.zero_heads = 2;
  run_indexer_case_per_storage(decode, "decode-");
  IndexerCase c;
  c.name = "prepared-input";
  c.prepared_input = true;
  c.positions = {5000, 777};
  run_indexer_case(c);
  c.name = "48-heads-k64";
  c.prepared_input = false;
  c.heads = 48;
  c.k = 64;
  c.positions = {1000, 3};
  run_indexer_case(c);
}

TEST(CudaDsv4Kernels, IndexerTiesAndOffGridRows) {
  SKIP_WITHOUT_GPU();
  IndexerCase c;
  c.name = "ties";
  c.distinct = 5;  // thousands of rows, five distinct keys: every score is tied many times
  c.positions = {8191, 3000};
  run_indexer_case(c);
  c.name = "offgrid-bf16";
  c.distinct = 0;
  c.model_grid = false;
  c.storage = kd::IndexerStorage::Bf16;
  c.positions = {600, 130};
  run_indexer_case(c);
}

// Rows and queries whose dot products fill the 22 significant bits that the 16-bit tensor-core paths allow (every
// 101st row and head 0 at the largest allowed span, max_span_values):
// every score must still equal the CPU's bits, with no row on the scalar path (for FP8 / MXFP4 rows too).
TEST(CudaDsv4Kernels, IndexerWideSpanRows) {
  SKIP_WITHOUT_GPU();
  IndexerCase c;
  c.wide_span = true;
  c.prepared_input = true;
  c.fallback = IndexerCase::Fallback::None;
  c.positions = {20000, 4000, 777};
  run_indexer_case_per_storage(c, "wide-span-");
}

// Key rows holding NaN, infinities, subnormals or -0 (poison_indexer_rows): the rows off the grid take the scalar
// path, and every score and index still equals the CPU's (NaN scores as NaN).
TEST(CudaDsv4Kernels, IndexerNonFiniteKeys) {
  SKIP_WITHOUT_GPU();
  IndexerCase c;
  c.special_values = true;
  c.fallback = IndexerCase::Fallback::Some;
  c.positions = {2000, 301};
  run_indexer_case_per_storage(c, "special-values-");
}

// Head weights at extreme powers of two. Tiny weights make w 2^fq inexact (below the normal range), so every row
// takes the scalar path. For MXFP4 and FP8 rows the terms are w 2^fq I with a per-row power of two (2^fk, the
// FP8 scale) applied to the head sum, exact only while every product is normal in both scales and no sum
// overflows: huge weights must take the scalar path there, and at 2^80 the guard must not trigger. The BF16 rows'
// path forms the CPU's terms themselves and needs no such guard: huge weights stay on the tensor cores, and tiny
// ones leave it only for tokens where some w_h 2^fq_h is subnormal and inexact (by the draw: 2 of 30 runs on the
// H200 had no such token, so that case asserts whole tokens, not "some"). Scores stay bit-identical to the CPU
// either way.
TEST(CudaDsv4Kernels, IndexerExtremeWeights) {
  SKIP_WITHOUT_GPU();
  for (auto st : {kd::IndexerStorage::Bf16, kd::IndexerStorage::Fp8, kd::IndexerStorage::Mxfp4}) {
    IndexerCase c;
    c.storage = st;
    c.positions = {3000, 517};
    c.name = std::string("tiny-weights-") + std::string(kd::indexer_storage_name(st));
    c.weight_scale = 0x1p-113f;
    c.fallback = st == kd::IndexerStorage::Bf16 ? IndexerCase::Fallback::WholeTokens : IndexerCase::Fallback::Some;
    run_indexer_case(c);
    c.name = std::string("huge-weights-") + std::string(kd::indexer_storage_name(st));
    c.weight_scale = 0x1p112f;
    c.fallback = st == kd::IndexerStorage::Bf16 ? IndexerCase::Fallback::None : IndexerCase::Fallback::Some;
    run_indexer_case(c);
    c.name = std::string("large-weights-") + std::string(kd::indexer_storage_name(st));
    c.weight_scale = 0x1p80f;
    c.fallback = IndexerCase::Fallback::None;
    run_indexer_case(c);
  }
}

TEST(CudaDsv4Kernels, TopkMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::printf("[dsv4-kernels] topk seed %llu\n", static_cast<unsigned long long>(seed));
  // Quantised scores (many ties), specials, lengths below / at / above k and a long list over many chunks.
  std::vector<std::vector<float>> tok;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{511}, std::size_t{512},
                        std::size_t{513}, std::size_t{5000}, std::size_t{70001}, std::size_t{262144}}) {
    std::vector<float> s(n);
    std::uniform_int_distribution<int> q(-50, 50);
    for (auto& x : s) x = static_cast<float>(q(rng)) * 0.125f;
    for (std::size_t j = 0; j < n; j += 97) s[j] = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t j = 5; j < n; j += 1013) s[j] = -0.0f;
    if (n > 10) s[10] = std::numeric_limits<float>::infinity();
    tok.push_back(std::move(s));
  }
  run_topk_case("mixed-512", tok, 512);
  run_topk_case("mixed-1024", tok, 1024);
  std::vector<std::vector<float>> all_equal(2, std::vector<float>(40000, 1.5f));
  run_topk_case("all-equal", all_equal, 512);
  std::vector<std::vector<float>> smooth(1, normal(rng, 262144));
  run_topk_case("normal-262144", smooth, 512);
  // A decode batch of 8 at 1M context (the benchmark's shape: 12- or 8-block clusters, whichever fit at once).
  std::vector<std::vector<float>> batch8;
  for (int t = 0; t < 8; ++t) batch8.push_back(normal(rng, 262144 - 4099 * static_cast<std::size_t>(t)));
  run_topk_case("batch8-normal", batch8, 512);
  // Beyond the previous version's row limit (524288 for k = 512), the widest k, k = 1, only NaN, and a batch
  // that takes one block per token instead of a cluster (more than 2 x multiprocessors / 8 tokens).
  std::vector<std::vector<float>> long_rows(1, normal(rng, 700001));
  for (std::size_t j = 3; j < long_rows[0].size(); j += 4099) long_rows[0][j] = long_rows[0][j - 3];  // exact ties
  run_topk_case("normal-700001", long_rows, 512);
  run_topk_case("normal-700001-k2048", long_rows, 2048);
  run_topk_case("normal-700001-k1", long_rows, 1);
  std::vector<std::vector<float>> nans(1, std::vector<float>(3000, std::numeric_limits<float>::quiet_NaN()));
  run_topk_case("all-nan", nans, 512);
  std::vector<std::vector<float>> many;
  for (int t = 0; t < 80; ++t) {
    std::vector<float> s(static_cast<std::size_t>(1000 + 397 * t));
    std::uniform_int_distribution<int> q(-20, 20);
    for (auto& x : s) x = static_cast<float>(q(rng));
    many.push_back(std::move(s));
  }
  run_topk_case("80-tokens-quantised", many, 512);
  // Every score in one bin of the first 11-bit digit (1 + q 2^-12, 1024 values, ~256 rows each): the blocks'
  // keys at or above that bin do not fit their shared-memory list, so the later digits (score and index) read
  // the scores from global memory again.
  std::vector<std::vector<float>> one_bin(1, std::vector<float>(262144));
  std::uniform_int_distribution<int> qb(0, 1023);
  for (auto& x : one_bin[0]) x = 1.0f + static_cast<float>(qb(rng)) * (1.0f / 4096.0f);
  run_topk_case("one-first-digit-bin", one_bin, 512);
}

TEST(CudaDsv4Kernels, AttentionMatchesOracle) {
  SKIP_WITHOUT_GPU();
  for (auto st : {kd::RowStorage::Bf16, kd::RowStorage::Fp8}) {
    for (std::uint32_t heads : {64u, 128u}) {
      AttnCase c;
      c.storage = st;
      c.heads = heads;
      c.name = "window-only";
      c.ratio = 0;
      c.positions = {0, 5, 127, 128, 4000};
      run_attention_case(c);
      c.name = "csa";
      c.ratio = 4;
      c.positions = {3, 200, 2047, 9000};
      run_attention_case(c);
      c.name = "hca";
      c.ratio = 128;
      c.positions = {127, 1000, 70000};
      c.q_scale = 2.0f;
      run_attention_case(c);
    }
  }
  AttnCase c;
  c.name = "no-sink-sharp";
  c.with_sink = false;
  c.q_scale = 4.0f;
  c.positions = {3000, 64};
  run_attention_case(c);
}

// Far above the model's scale: compressed rows growing along the row list (up to 9.5x at ratio 128, 36x at ratio
// 4) and q at 4x, so that rows of large norm compete with logits of tens to hundreds. With the query in bf16 (the
// model's activations), fp16 holds it exactly and the scores are exact up to f32 accumulation, so the bound holds
// at any such scale. (An f32 query is rounded to fp16, 11 significant bits: at these scales that moves the
// softmax weights by a few per cent, 3.6e-3 to 1.6e-2 of max|out| when measured on 2026-12-02; the limit is
// documented in docs/cuda-dsv4-kernels.md, "Sparse attention", and not asserted here.)
TEST(CudaDsv4Kernels, AttentionMatchesOracleFarAboveModelScaleWithBf16Queries) {
  SKIP_WITHOUT_GPU();
  for (auto st : {kd::RowStorage::Bf16, kd::RowStorage::Fp8}) {
    for (std::uint32_t heads : {64u, 128u}) {
      AttnCase c;
      c.storage = st;
      c.heads = heads;
      c.q_scale = 4.0f;
      c.q_bf16 = true;
      c.row_growth = 1.0f / 64.0f;
      c.name = "csa-rising-bf16q";
      c.ratio = 4;
      c.positions = {9000, 2047};
      run_attention_case(c);
      c.name = "hca-rising-bf16q";
      c.ratio = 128;
      c.positions = {70000, 1000};
      run_attention_case(c);
    }
  }
}

TEST(CudaDsv4Kernels, AttentionPrefillChunk) {
  SKIP_WITHOUT_GPU();
  for (auto st : {kd::RowStorage::Bf16, kd::RowStorage::Fp8}) {
    for (std::uint32_t ratio : {0u, 4u, 128u}) {
      AttnCase c;
      c.storage = st;
      c.ratio = ratio;
      c.prefill = true;
      c.name = "prefill";
      c.check_every = 13;
      for (std::int64_t t = 1000; t < 1300; ++t) c.positions.push_back(t);  // a chunk longer than the window
      run_attention_case(c);
    }
  }
}

// Every launcher that keeps state per device (cuda/per_device.hpp), each against the CPU oracle: the indexer
// (every storage), the top-k (its cluster path for one token) and the attention (16-head blocks at ratio 4, and a
// 140-token prefill chunk of FP8 rows at ratio 128, whose 64-head blocks take the warpgroup kernel). What it can
// catch: the attention kernels' shared-memory attributes (225 KB for the warpgroup kernel) fail the launch on a
// device, or in a context, where they are not set. The indexer's (≈ 34 KB) fit the 48 KB default, the top-k sets
// its attributes at every launch, and occupancy answers and multiprocessor counts stay right on a like device, so
// a stale value there would pass; PerDevice's own CPU tests (tests/cuda/per_device_test.cpp) cover the slots.
void run_every_stateful_launcher(const std::string& label) {
  IndexerCase indexer;
  indexer.positions = {3, 42, 300};
  indexer.k = 16;
  run_indexer_case_per_storage(indexer, label + "-");
  run_topk_case(label, {{1.0f, 3.0f, 2.0f, 2.0f, -1.0f, 0.5f, 4.0f, 0.0f, 1.0f}}, 4);
  AttnCase attention;
  attention.name = label + "-ratio-4";
  attention.heads = 64;
  attention.topk = 8;
  attention.ratio = 4;
  attention.positions = {50, 5};
  run_attention_case(attention);
  AttnCase chunk;  // as AttentionDirectOutput: more 16- or 32-head blocks than multiprocessors
  chunk.name = label + "-fp8-ratio-128-warpgroup";
  chunk.storage = kd::RowStorage::Fp8;
  chunk.ratio = 128;
  chunk.prefill = true;
  chunk.check_every = 7;
  for (std::int64_t t = 1000; t < 1140; ++t) chunk.positions.push_back(t);
  run_attention_case(chunk);
}

// On the first device, then on the second and on the first again. Needs two devices (the nvidia-h100-x2 kind);
// skips otherwise.
TEST(CudaDsv4KernelsMultiDevice, EveryLauncherRunsOnEachDevice) {
  const int devices = device_count();
  if (devices < 2) GTEST_SKIP() << "needs two CUDA devices (" << devices << " present)";
  struct BackToDeviceZero {  // also when an assertion returns early, so later tests run where they expect
    ~BackToDeviceZero() { (void)cudaSetDevice(0); }
  } restore;
  for (const int device : {0, 1, 0}) {
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    SCOPED_TRACE("device " + std::to_string(device));
    run_every_stateful_launcher("device-" + std::to_string(device));
  }
}

// Before and after cudaDeviceReset, which destroys the device's primary context; the runtime makes a new one on the
// next call. The launchers set their attributes once per device (PerDevice), so this holds only while the runtime
// keeps attributes set through cudaFuncSetAttribute for the new context, as CUDA 13.0 does
// (scripts/gpu/attribute_after_reset.cu; docs/cuda.md, "Several devices"). The test binary keeps no device memory
// across tests, so the reset takes nothing from later tests.
TEST(CudaDsv4KernelsDeviceReset, EveryLauncherRunsAfterAReset) {
  SKIP_WITHOUT_GPU();
  run_every_stateful_launcher("before-reset");
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  run_every_stateful_launcher("after-reset");
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4
