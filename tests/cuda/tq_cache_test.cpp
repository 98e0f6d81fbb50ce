// DeviceCache (the GPU-resident TurboQuant cache) replays random traces — appends of random sizes and dtypes,
// truncations, resets, snapshot / restore — next to the CPU TurboQuantCache: every snapshot must have the same
// bytes, and decode attention must match the float64 oracle over the CPU cache. Chunked appends followed by
// chunked-prefill attention (DeviceCache::attention) must match the CPU cache's attention and the float64
// oracle; append / attention argument errors must equal the CPU cache's. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
#include "cuda/cuda_test_util.hpp"
#include "cuda/device_cache_checks.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::expect_decode_matches_oracle;
using kvcompact::cuda::testing::expect_same_snapshot;
using kvcompact::cuda::testing::append_same_random_rows;
using kvcompact::cuda::testing::take;
using kvcompact::cuda::testing::worst_row_error;

using kvcompact::tq::AttentionOptions;
using kvcompact::tq::AttentionRequest;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::random_rows;

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
    for (std::uint32_t layer : {0u, 2u}) expect_decode_matches_oracle(cpu, gpu, layer, 8, rng);
    // A key whose norm fits float32 while its norm-corrected norm ‖k‖ / ‖c‖ does not: both caches refuse it
    // alike (OutOfRange, nothing visible) in the nc mode, and both store it in the others.
    if (const std::uint32_t at = gpu.length(0, 0); at < shape.capacity) {
      std::vector<float> k(std::size_t{heads} * d, 0.0f), v(k.size(), 0.5f);
      k[3] = 3.3895313892515355e38f;  // bf16's largest finite value; ‖c‖ ≈ 0.94 for a rotated one-hot (4 bits)
      const Status cs = cpu.append(0, 0, at, 1, DType::F32, k.data(), v.data());
      auto dk = take(DeviceBuffer::allocate(k.size() * 4));
      auto dv = take(DeviceBuffer::allocate(v.size() * 4));
      ASSERT_TRUE(dk.upload(k.data(), k.size() * 4).ok());
      ASSERT_TRUE(dv.upload(v.data(), v.size() * 4).ok());
      const Status gs = gpu.append(0, 0, at, 1, DType::F32, dk.data(), dv.data());
      if (config.norm_correction) {
        EXPECT_EQ(cs.error().code, ErrorCode::OutOfRange);
        EXPECT_EQ(gs.error().code, ErrorCode::OutOfRange);
      } else {
        EXPECT_TRUE(cs.ok()) << cs.error().to_string();
        EXPECT_TRUE(gs.ok()) << gs.error().to_string();
      }
      EXPECT_EQ(cpu.length(0, 0), gpu.length(0, 0));
      expect_same_snapshot(take(cpu.snapshot(0, 0)), take(gpu.snapshot(0, 0)), "after the near-float32-max key");
      // Where stored, the key leaves both caches again: a query coordinate beyond ±1.004 takes its score past
      // float32's range (the device gave one head 0 where the float64 oracle had the row's value: seed
      // 3351842076794997815, k=prod4,v=mse4,w=40), and the decode below checks the NaN row, not that range.
      ASSERT_TRUE(cpu.truncate_layer(0, 0, at).ok());
      ASSERT_TRUE(gpu.truncate_layer(0, 0, at).ok());
    }
    // Bad input: NaN, in the last of three rows, is reported by both caches and changes nothing — the exact
    // window included: its ring slots keep the rows before (the first two rows are good, so a ring write before
    // the verdict would show here).
    const std::uint32_t seq = 0, layer = 0, length = gpu.length(0, 0);
    if (length + 3 <= shape.capacity) {
      std::vector<float> k(3 * std::size_t{heads} * d, 1.0f), v(k.size(), 1.0f);
      k[k.size() - 7] = std::numeric_limits<float>::quiet_NaN();
      auto dk = take(DeviceBuffer::allocate(k.size() * 4));
      auto dv = take(DeviceBuffer::allocate(v.size() * 4));
      ASSERT_TRUE(dk.upload(k.data(), k.size() * 4).ok());
      ASSERT_TRUE(dv.upload(v.data(), v.size() * 4).ok());
      EXPECT_EQ(cpu.append(layer, seq, length, 3, DType::F32, k.data(), v.data()).error().code, ErrorCode::NonFinite);
      const Status s = gpu.append(layer, seq, length, 3, DType::F32, dk.data(), dv.data());
      EXPECT_EQ(s.error().code, ErrorCode::NonFinite);
      EXPECT_EQ(gpu.length(layer, seq), length);
      expect_same_snapshot(take(cpu.snapshot(layer, seq)), take(gpu.snapshot(layer, seq)), "after the NaN row");
      expect_decode_matches_oracle(cpu, gpu, layer, 8, rng);
    }
    EXPECT_EQ(gpu.append(0, 0, gpu.length(0, 0) + 1, 1, DType::F32, nullptr, nullptr).error().code,
              ErrorCode::OutOfRange);
  }
}

// Random chunked appends (device rows) into a DeviceCache and a CPU cache; after each append the chunk's queries
// attend causally (DeviceCache::attention = chunked prefill) and must match TurboQuantCache::attention and the
// float64 oracle within 1e-3 per row. A final batched call covers all sequences at once with sinks and a scale.
TEST(CudaCache, ChunkedPrefillMatchesTheCpuCache) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const char* const modes[] = {"k=prod3,v=mse2,w=24", "k=mse4,v=mse3,nc"};
  for (const char* mode : modes) {
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string("mode ") + mode + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    CacheShape shape;
    shape.head_dim = 128;
    shape.kv_heads = {0, 2};
    shape.sequences = 3;
    shape.capacity = 613;
    auto cpu = take(TurboQuantCache::create(shape, config));
    auto gpu = take(DeviceCache::create(shape, config));
    const std::uint32_t d = shape.head_dim, heads = 2, q_heads = 8, layer = 1;
    const std::size_t row_floats = std::size_t{q_heads} * d;
    double worst_cpu = 0.0, worst_oracle = 0.0;
    for (int step = 0; step < 12; ++step) {
      const std::uint32_t seq = static_cast<std::uint32_t>(rng() % shape.sequences);
      const std::uint32_t length = cpu.length(layer, seq);
      const std::uint32_t room = shape.capacity - length;
      if (room == 0) continue;
      const std::uint32_t rows = 1 + static_cast<std::uint32_t>(rng() % std::min<std::uint32_t>(room, 160));
      ASSERT_TRUE(append_same_random_rows(rng, cpu, gpu, layer, seq, length, rows, heads, d));
      // The chunk's own queries.
      const auto q = random_rows(rng, std::size_t{rows} * q_heads, d, 1.0f, false);
      auto dq = take(DeviceBuffer::allocate(q.size() * 4));
      ASSERT_TRUE(dq.upload(q.data(), q.size() * 4).ok());
      auto dout = take(DeviceBuffer::allocate(q.size() * 4));
      ASSERT_TRUE(dout.fill(0xFF).ok());
      AttentionRequest req;
      req.seq = seq;
      req.first_position = length;
      req.rows = rows;
      req.queries = static_cast<const float*>(dq.data());
      req.output = static_cast<float*>(dout.data());
      AttentionOptions options;
      options.q_heads = q_heads;
      const Status ran = gpu.attention(layer, {&req, 1}, options);
      ASSERT_TRUE(ran.ok()) << ran.error().to_string();
      ASSERT_TRUE(synchronize().ok());
      std::vector<float> got(q.size()), want(q.size());
      ASSERT_TRUE(dout.download(got.data(), got.size() * 4).ok());
      AttentionRequest host = req;
      host.queries = q.data();
      host.output = want.data();
      ASSERT_TRUE(cpu.attention(layer, {&host, 1}, options).ok());
      const std::vector<double> want_d(want.begin(), want.end());
      const double e_cpu = worst_row_error(got, want_d, row_floats);
      auto ref = take(kvcompact::tq::attention_oracle(cpu.view(layer), {&host, 1}, options));
      const double e_oracle = worst_row_error(got, ref[0], row_floats);
      EXPECT_LE(e_cpu, 1e-3) << "step " << step << " seq " << seq << " chunk [" << length << ", " << length + rows << ")";
      EXPECT_LE(e_oracle, 1e-3) << "step " << step << " seq " << seq << " chunk [" << length << ", " << length + rows << ")";
      worst_cpu = std::isnan(e_cpu) ? e_cpu : std::max(worst_cpu, e_cpu);
      worst_oracle = std::isnan(e_oracle) ? e_oracle : std::max(worst_oracle, e_oracle);
    }
    // One batched call over every sequence: the last min(length, 50) positions of each, sinks, a scale.
    std::vector<AttentionRequest> reqs, hosts;
    std::vector<float> q_all;
    std::vector<std::size_t> offsets;
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const std::uint32_t len = cpu.length(layer, s);
      const std::uint32_t rows = std::min<std::uint32_t>(len, 50);
      AttentionRequest r;
      r.seq = s;
      r.first_position = len - rows;
      r.rows = rows;
      reqs.push_back(r);
      offsets.push_back(q_all.size());
      const auto q = random_rows(rng, std::size_t{rows} * q_heads, d, 1.0f, false);
      q_all.insert(q_all.end(), q.begin(), q.end());
    }
    auto dq = take(DeviceBuffer::allocate(std::max<std::size_t>(q_all.size(), 1) * 4));
    ASSERT_TRUE(dq.upload(q_all.data(), q_all.size() * 4).ok());
    auto dout = take(DeviceBuffer::allocate(std::max<std::size_t>(q_all.size(), 1) * 4));
    ASSERT_TRUE(dout.fill(0xFF).ok());
    std::vector<float> sinks(q_heads);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& x : sinks) x = normal(rng);
    auto dsinks = take(DeviceBuffer::allocate(4ull * q_heads));
    ASSERT_TRUE(dsinks.upload(sinks.data(), 4ull * q_heads).ok());
    std::vector<float> want(q_all.size()), got(q_all.size());
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      reqs[s].queries = static_cast<const float*>(dq.data()) + offsets[s];
      reqs[s].output = static_cast<float*>(dout.data()) + offsets[s];
      AttentionRequest h = reqs[s];
      h.queries = q_all.data() + offsets[s];
      h.output = want.data() + offsets[s];
      hosts.push_back(h);
    }
    AttentionOptions options;
    options.q_heads = q_heads;
    options.scale = 0.07f;
    options.sinks = static_cast<const float*>(dsinks.data());
    const Status ran = gpu.attention(layer, reqs, options);
    ASSERT_TRUE(ran.ok()) << ran.error().to_string();
    ASSERT_TRUE(synchronize().ok());
    ASSERT_TRUE(dout.download(got.data(), got.size() * 4).ok());
    options.sinks = sinks.data();
    ASSERT_TRUE(cpu.attention(layer, hosts, options).ok());
    auto ref = take(kvcompact::tq::attention_oracle(cpu.view(layer), hosts, options));
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const std::vector<float> g(got.begin() + offsets[s], got.begin() + offsets[s] + std::size_t{reqs[s].rows} * row_floats);
      const std::vector<double> w(want.begin() + offsets[s], want.begin() + offsets[s] + std::size_t{reqs[s].rows} * row_floats);
      const double e_cpu = worst_row_error(g, w, row_floats), e_oracle = worst_row_error(g, ref[s], row_floats);
      EXPECT_LE(e_cpu, 1e-3) << "batched, sequence " << s;
      EXPECT_LE(e_oracle, 1e-3) << "batched, sequence " << s;
      worst_cpu = std::isnan(e_cpu) ? e_cpu : std::max(worst_cpu, e_cpu);
      worst_oracle = std::isnan(e_oracle) ? e_oracle : std::max(worst_oracle, e_oracle);
    }
    std::printf("[prefill-cache] %s: worst row error vs CPU cache attention %.3g, vs float64 oracle %.3g\n", mode,
                worst_cpu, worst_oracle);
  }
}

// The device cache's append and attention reject the same calls as the CPU cache with the same errors.
TEST(CudaCache, ArgumentErrorsEqualTheCpuCache) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const QuantConfig config = QuantConfig::seed_system(3);
  CacheShape shape;
  shape.head_dim = 64;
  shape.kv_heads = {1};
  shape.sequences = 2;
  shape.capacity = 8;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  std::vector<float> rows(8 * 64, 0.5f);
  auto drows = take(DeviceBuffer::allocate(rows.size() * 4));
  ASSERT_TRUE(drows.upload(rows.data(), rows.size() * 4).ok());
  const void* h = rows.data();
  const void* dv = drows.data();
  ASSERT_TRUE(cpu.append(0, 0, 0, 2, DType::F32, h, h).ok());
  ASSERT_TRUE(gpu.append(0, 0, 0, 2, DType::F32, dv, dv).ok());
  struct Call {
    std::uint32_t position, rows;
    DType dtype;
    bool null;
  };
  const Call calls[] = {{1, 1, DType::F32, false}, {3, 1, DType::F32, false}, {2, 7, DType::F32, false},
                        {2, 1, DType::F8E4M3, false},  {2, 1, DType::F32, true},  {2, 0, DType::F8E4M3, true}};
  for (const Call& c : calls) {
    const Status a = cpu.append(0, 0, c.position, c.rows, c.dtype, c.null ? nullptr : h, c.null ? nullptr : h);
    const Status b = gpu.append(0, 0, c.position, c.rows, c.dtype, c.null ? nullptr : dv, c.null ? nullptr : dv);
    ASSERT_EQ(a.ok(), b.ok()) << "position " << c.position << " rows " << c.rows;
    if (a.ok()) continue;
    EXPECT_EQ(a.error().code, b.error().code);
    EXPECT_EQ(a.error().message, b.error().message);
    EXPECT_EQ(a.error().expected, b.error().expected);
    EXPECT_EQ(a.error().actual, b.error().actual);
  }
  // Attention: past the length, sequence out of range, q_heads not a multiple, null output.
  std::vector<float> out(4 * 64);
  AttentionOptions options;
  options.q_heads = 2;
  AttentionRequest bad_cases[3];
  bad_cases[0] = {0, 1, 2, rows.data(), out.data()};
  bad_cases[1] = {5, 0, 1, rows.data(), out.data()};
  bad_cases[2] = {0, 0, 1, rows.data(), nullptr};
  for (const AttentionRequest& r : bad_cases) {
    const Status a = cpu.attention(0, {&r, 1}, options);
    const Status b = gpu.attention(0, {&r, 1}, options);
    ASSERT_FALSE(a.ok());
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(a.error().code, b.error().code);
    EXPECT_EQ(a.error().message, b.error().message);
  }
  options.q_heads = 0;
  const AttentionRequest fine{0, 0, 1, rows.data(), out.data()};
  EXPECT_EQ(cpu.attention(0, {&fine, 1}, options).error().code, gpu.attention(0, {&fine, 1}, options).error().code);
}

// A decode or prefill plan made for another layer's layout (here 2 KV heads against 4): Mismatch before any
// launch. (The decode took the plan's region offsets and head count and walked the other layer's buffer.)
TEST(CudaCache, PlansOfAnotherLayerAreRejected) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const QuantConfig config = QuantConfig::recommended(5);
  CacheShape shape;
  shape.head_dim = 64;
  shape.kv_heads = {2, 4};
  shape.sequences = 2;
  shape.capacity = 64;
  auto gpu = take(DeviceCache::create(shape, config));
  const DecodePlan two = take(gpu.plan_decode(0, 8, 16));
  const DecodePlan four = take(gpu.plan_decode(1, 8, 16));
  auto mismatch = [](const Status& st) {
    return !st.ok() && st.error().code == ErrorCode::Mismatch &&
           st.error().message.find("another layout") != std::string::npos;
  };
  EXPECT_TRUE(mismatch(gpu.decode(0, four, nullptr, nullptr, 0.0f, nullptr, nullptr)));
  EXPECT_TRUE(mismatch(gpu.decode(1, two, nullptr, nullptr, 0.0f, nullptr, nullptr)));
  const PrefillPlan prefill_two = take(gpu.plan_prefill(0, 8, 16));
  EXPECT_TRUE(mismatch(gpu.prefill(1, prefill_two, PrefillArgs{})));
}

}  // namespace
}  // namespace kvcompact::cuda::tq
