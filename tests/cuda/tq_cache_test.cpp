// DeviceCache (the GPU-resident TurboQuant cache) replays random traces — appends of random sizes and dtypes,
// truncations, resets, snapshot / restore — next to the CPU TurboQuantCache: every snapshot must have the same
// bytes, and decode attention must match the float64 oracle over the CPU cache. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/attention_oracle.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::tq::AttentionOptions;
using kvcompact::tq::AttentionRequest;
using kvcompact::tq::CacheShape;
using kvcompact::tq::LayerSnapshot;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::max_row_relative_error;
using kvcompact::tq::testing::random_rows;

template <typename T>
T take(Result<T>&& r) {
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

void expect_same_snapshot(const LayerSnapshot& a, const LayerSnapshot& b, const std::string& where) {
  EXPECT_EQ(a.length, b.length) << where;
  EXPECT_EQ(a.window_begin, b.window_begin) << where;
  EXPECT_TRUE(a.key_codes == b.key_codes) << where << ": key codes differ";
  EXPECT_TRUE(a.key_signs == b.key_signs) << where << ": key signs differ";
  EXPECT_TRUE(a.key_norms == b.key_norms) << where << ": key norms differ";
  EXPECT_TRUE(a.key_residual_norms == b.key_residual_norms) << where << ": residual norms differ";
  EXPECT_TRUE(a.value_codes == b.value_codes) << where << ": value codes differ";
  EXPECT_TRUE(a.value_norms == b.value_norms) << where << ": value norms differ";
  EXPECT_TRUE(a.window_keys == b.window_keys) << where << ": window keys differ";
  EXPECT_TRUE(a.window_values == b.window_values) << where << ": window values differ";
}

TEST(CudaCache, RandomTracesMatchTheCpuCache) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const char* const modes[] = {"k=prod3,v=mse2,w=16", "k=mse4,v=mse3,nc", "k=prod4,v=mse4,w=40"};
  for (const char* mode : modes) {
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string("mode ") + mode + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    CacheShape shape;
    shape.head_dim = 128;
    shape.kv_heads = {2, 0, 2};  // layer 1 has no attention but counts in the seeds
    shape.sequences = 3;
    shape.capacity = 333;
    auto cpu = take(TurboQuantCache::create(shape, config));
    auto gpu = take(DeviceCache::create(shape, config));
    const std::uint32_t d = shape.head_dim, heads = 2;
    std::uniform_int_distribution<int> op_dist(0, 9);
    for (int step = 0; step < 40; ++step) {
      const std::uint32_t layer = (rng() % 2) * 2;
      const std::uint32_t seq = static_cast<std::uint32_t>(rng() % shape.sequences);
      const int op = op_dist(rng);
      if (op < 6) {
        const std::uint32_t length = cpu.length(layer, seq);
        const std::uint32_t room = shape.capacity - length;
        const std::uint32_t rows = room == 0 ? 0 : static_cast<std::uint32_t>(rng() % std::min<std::uint32_t>(room + 1, 90));
        const DType dtype = (rng() % 2) ? DType::F32 : DType::BF16;
        const auto k = random_rows(rng, std::size_t{rows} * heads, d, 1.0f, true);
        const auto v = random_rows(rng, std::size_t{rows} * heads, d, 1.0f, false);
        std::vector<std::uint8_t> kb, vb;
        if (dtype == DType::F32) {
          kb.resize(k.size() * 4);
          vb.resize(v.size() * 4);
          std::memcpy(kb.data(), k.data(), kb.size());
          std::memcpy(vb.data(), v.data(), vb.size());
        } else {
          kb.resize(k.size() * 2);
          vb.resize(v.size() * 2);
          for (std::size_t i = 0; i < k.size(); ++i) {
            const std::uint16_t a = f32_to_bf16(k[i]), b = f32_to_bf16(v[i]);
            std::memcpy(kb.data() + 2 * i, &a, 2);
            std::memcpy(vb.data() + 2 * i, &b, 2);
          }
        }
        ASSERT_TRUE(cpu.append(layer, seq, length, rows, dtype, kb.data(), vb.data()).ok());
        auto dk = take(DeviceBuffer::allocate(std::max<std::size_t>(kb.size(), 4)));
        auto dv = take(DeviceBuffer::allocate(std::max<std::size_t>(vb.size(), 4)));
        ASSERT_TRUE(dk.upload(kb.data(), kb.size()).ok());
        ASSERT_TRUE(dv.upload(vb.data(), vb.size()).ok());
        const Status s = gpu.append(layer, seq, length, rows, dtype, dk.data(), dv.data());
        ASSERT_TRUE(s.ok()) << s.error().to_string();
      } else if (op < 8) {
        const std::uint32_t length = cpu.length(layer, seq);
        const std::uint32_t pos = length == 0 ? 0 : static_cast<std::uint32_t>(rng() % (length + 1));
        ASSERT_TRUE(cpu.truncate(seq, pos).ok());
        ASSERT_TRUE(gpu.truncate(seq, pos).ok());
      } else if (op < 9) {
        // Snapshot one sequence and restore it into another (both caches).
        const std::uint32_t to = static_cast<std::uint32_t>(rng() % shape.sequences);
        auto cs = take(cpu.snapshot(layer, seq));
        auto gs = take(gpu.snapshot(layer, seq));
        ASSERT_TRUE(cpu.restore(layer, to, cs).ok());
        ASSERT_TRUE(gpu.restore(layer, to, gs).ok());
      } else {
        ASSERT_TRUE(cpu.reset(seq).ok());
        ASSERT_TRUE(gpu.reset(seq).ok());
      }
      for (std::uint32_t l : {0u, 2u}) {
        for (std::uint32_t s = 0; s < shape.sequences; ++s) {
          ASSERT_EQ(cpu.length(l, s), gpu.length(l, s));
          expect_same_snapshot(take(cpu.snapshot(l, s)), take(gpu.snapshot(l, s)),
                               "step " + std::to_string(step) + " layer " + std::to_string(l) + " seq " +
                                   std::to_string(s));
        }
      }
    }
    // Decode attention of the device cache against the float64 oracle over the CPU cache (same bytes).
    for (std::uint32_t layer : {0u, 2u}) {
      const std::uint32_t q_heads = 8;
      auto plan = take(gpu.plan_decode(layer, q_heads, shape.capacity));
      auto ws = take(DeviceBuffer::allocate(plan.workspace_bytes));
      const auto q = random_rows(rng, std::size_t{shape.sequences} * q_heads, d, 1.0f, false);
      auto dq = take(DeviceBuffer::allocate(q.size() * 4));
      ASSERT_TRUE(dq.upload(q.data(), q.size() * 4).ok());
      auto dout = take(DeviceBuffer::allocate(q.size() * 4));
      ASSERT_TRUE(dout.fill(0xFF).ok());
      const Status s = gpu.decode(layer, plan, static_cast<const float*>(dq.data()), nullptr, 0.0f,
                                  static_cast<float*>(dout.data()), ws.data());
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      ASSERT_TRUE(synchronize().ok());
      std::vector<float> out(q.size());
      ASSERT_TRUE(dout.download(out.data(), out.size() * 4).ok());
      std::vector<AttentionRequest> reqs;
      std::vector<std::uint32_t> seqs;
      for (std::uint32_t s2 = 0; s2 < shape.sequences; ++s2) {
        if (cpu.length(layer, s2) == 0) continue;
        AttentionRequest r;
        r.seq = s2;
        r.first_position = cpu.length(layer, s2) - 1;
        r.rows = 1;
        r.queries = q.data() + std::size_t{s2} * q_heads * d;
        r.output = out.data();
        reqs.push_back(r);
        seqs.push_back(s2);
      }
      AttentionOptions options;
      options.q_heads = q_heads;
      auto ref = take(kvcompact::tq::attention_oracle(cpu.view(layer), reqs, options));
      const std::size_t row = std::size_t{q_heads} * d;
      for (std::size_t i = 0; i < reqs.size(); ++i) {
        std::vector<float> got(out.begin() + seqs[i] * row, out.begin() + (seqs[i] + 1) * row);
        EXPECT_LE(max_row_relative_error(got, ref[i], row), 1e-3) << "layer " << layer << " seq " << seqs[i];
      }
    }
    // Bad input: NaN is reported and nothing becomes visible.
    const std::uint32_t seq = 0, layer = 0, length = gpu.length(0, 0);
    if (length < shape.capacity) {
      std::vector<float> k(std::size_t{heads} * d, 1.0f), v(k.size(), 1.0f);
      k[7] = std::numeric_limits<float>::quiet_NaN();
      auto dk = take(DeviceBuffer::allocate(k.size() * 4));
      auto dv = take(DeviceBuffer::allocate(v.size() * 4));
      ASSERT_TRUE(dk.upload(k.data(), k.size() * 4).ok());
      ASSERT_TRUE(dv.upload(v.data(), v.size() * 4).ok());
      const Status s = gpu.append(layer, seq, length, 1, DType::F32, dk.data(), dv.data());
      EXPECT_EQ(s.error().code, ErrorCode::NonFinite);
      EXPECT_EQ(gpu.length(layer, seq), length);
    }
    EXPECT_EQ(gpu.append(0, 0, gpu.length(0, 0) + 1, 1, DType::F32, nullptr, nullptr).error().code,
              ErrorCode::OutOfRange);
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq
