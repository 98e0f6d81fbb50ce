// run_attention_case (kernel_cases.hpp): sparse attention within 2e-3 of the float64 oracle (64 / 128 heads,
// window only, ratio 4 / 128, BF16 and FP8 rows, decode batches with different positions, a prefill chunk reading
// its own rows).
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

}  // namespace

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
    // Ring: positions [max(0, first - 127), first) at slot p mod ring_capacity; chunk: positions [first, last].
    const std::uint32_t ring_rows = c.ring_capacity;
    EXPECT_TRUE(ring_rows == 128 || last < ring_rows) << "a ring smaller than 128 rows belongs to a context below it";
    s.ring_bytes.assign(std::size_t{ring_rows} * rb, 0xAB);  // garbage in unused slots must never be read
    for (std::int64_t p = std::max<std::int64_t>(0, first - 127); p < first; ++p) {
      s.window[p] = model_attention_row(rng, c.storage, s.ring_bytes, static_cast<std::size_t>(p % ring_rows));
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
      tokens[i].ring_capacity = ring_rows;
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

}  // namespace kvcompact::cuda::dsv4::kernel_cases
