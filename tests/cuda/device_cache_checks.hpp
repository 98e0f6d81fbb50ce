// Checks shared by the DeviceCache tests (tq_cache_test.cpp, tq_append_batch_test.cpp,
// tq_attention_workspace_test.cpp): a device cache against a CPU TurboQuantCache that received the same
// operations — snapshot bytes field by field, decode attention against the float64 oracle over the CPU cache's
// bytes, and attention outputs row by row.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/attention_oracle.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::testing {

// Per query row (all heads of one token): max |a − b| / max |b|.
inline double worst_row_error(const std::vector<float>& out, const std::vector<double>& ref,
                              std::size_t row_floats) {
  double worst = 0.0;
  for (std::size_t r = 0; (r + 1) * row_floats <= ref.size(); ++r) {
    double diff = 0.0, top = 0.0;
    for (std::size_t j = r * row_floats; j < (r + 1) * row_floats; ++j) {
      const double dlt = static_cast<double>(out[j]) - ref[j];
      if (std::isnan(dlt)) return dlt;
      diff = std::max(diff, std::fabs(dlt));
      top = std::max(top, std::fabs(ref[j]));
    }
    worst = std::max(worst, top > 0.0 ? diff / top : diff);
  }
  return worst;
}

// Appends the same random f32 rows (keys with outlier channels, as random_rows makes them) at `position` of
// (layer, seq) to the CPU cache from host memory and to the device cache from device buffers.
inline ::testing::AssertionResult append_same_random_rows(std::mt19937_64& rng, kvcompact::tq::TurboQuantCache& cpu,
                                                          tq::DeviceCache& gpu, std::uint32_t layer, std::uint32_t seq,
                                                          std::uint32_t position, std::uint32_t rows,
                                                          std::uint32_t heads, std::uint32_t d) {
  using kvcompact::tq::testing::random_rows;
  const auto k = random_rows(rng, std::size_t{rows} * heads, d, 1.0f, true);
  const auto v = random_rows(rng, std::size_t{rows} * heads, d, 1.0f, false);
  const Status on_cpu = cpu.append(layer, seq, position, rows, DType::F32, k.data(), v.data());
  if (!on_cpu.ok()) return ::testing::AssertionFailure() << "CPU append: " << on_cpu.error().to_string();
  auto dk = DeviceBuffer::allocate(k.size() * 4);
  auto dv = DeviceBuffer::allocate(v.size() * 4);
  if (!dk.ok() || !dv.ok()) return ::testing::AssertionFailure() << "device buffers for the rows";
  if (!dk->upload(k.data(), k.size() * 4).ok() || !dv->upload(v.data(), v.size() * 4).ok()) {
    return ::testing::AssertionFailure() << "upload of the rows";
  }
  const Status on_gpu = gpu.append(layer, seq, position, rows, DType::F32, dk->data(), dv->data());
  if (!on_gpu.ok()) return ::testing::AssertionFailure() << "device append: " << on_gpu.error().to_string();
  return ::testing::AssertionSuccess();
}

inline void expect_same_snapshot(const kvcompact::tq::LayerSnapshot& a, const kvcompact::tq::LayerSnapshot& b,
                                 const std::string& where) {
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

// Every sequence of each of `layers`: the device cache's snapshot byte-equal to the CPU cache's.
inline void expect_layers_match(const kvcompact::tq::TurboQuantCache& cpu, const tq::DeviceCache& gpu,
                                std::initializer_list<std::uint32_t> layers, const std::string& where) {
  for (std::uint32_t layer : layers) {
    for (std::uint32_t s = 0; s < gpu.sequences(); ++s) {
      expect_same_snapshot(take(cpu.snapshot(layer, s)), take(gpu.snapshot(layer, s)),
                           where + " layer " + std::to_string(layer) + " seq " + std::to_string(s));
    }
  }
}

// `out` (host [sequences, q_heads, head_dim]), a decode of every sequence of `layer` for the queries `q` (host,
// the same shape, no sinks, scale 1/√d): each non-empty sequence's rows within 1e-3 relative of the float64
// oracle over the CPU cache; `where` names the call in failures.
inline void expect_decode_output_matches_oracle(const kvcompact::tq::TurboQuantCache& cpu, std::uint32_t layer,
                                                std::uint32_t q_heads, const std::vector<float>& q,
                                                const std::vector<float>& out, const std::string& where = "") {
  using kvcompact::tq::AttentionRequest;
  const std::uint32_t d = cpu.head_dim(), sequences = cpu.sequences();
  std::vector<AttentionRequest> reqs;
  std::vector<std::uint32_t> seqs;
  for (std::uint32_t s2 = 0; s2 < sequences; ++s2) {
    if (cpu.length(layer, s2) == 0) continue;
    AttentionRequest r;
    r.seq = s2;
    r.first_position = cpu.length(layer, s2) - 1;
    r.rows = 1;
    r.queries = q.data() + std::size_t{s2} * q_heads * d;
    r.output = const_cast<float*>(out.data());  // (not written: the oracle returns its rows)
    reqs.push_back(r);
    seqs.push_back(s2);
  }
  kvcompact::tq::AttentionOptions options;
  options.q_heads = q_heads;
  auto ref = take(kvcompact::tq::attention_oracle(cpu.view(layer), reqs, options));
  const std::size_t row = std::size_t{q_heads} * d;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    std::vector<float> got(out.begin() + seqs[i] * row, out.begin() + (seqs[i] + 1) * row);
    EXPECT_LE(kvcompact::tq::testing::max_row_relative_error(got, ref[i], row), 1e-3)
        << where << " layer " << layer << " seq " << seqs[i];
  }
  // An empty sequence's output is exactly 0 (DecodeArgs); a device length left stale by a reset or truncate
  // would show here, where the oracle has nothing to compare.
  for (std::uint32_t s2 = 0; s2 < sequences; ++s2) {
    if (cpu.length(layer, s2) != 0) continue;
    std::size_t nonzero = 0;
    for (std::size_t j = s2 * row; j < (s2 + 1) * row; ++j) nonzero += out[j] != 0.0f;
    EXPECT_EQ(nonzero, 0u) << where << " layer " << layer << " seq " << s2 << " is empty but its output is not 0";
  }
}

// Decode attention of every non-empty sequence of `layer` (random queries, q_heads heads, no sinks) on the
// device cache, on `stream`, within 1e-3 relative per row of the float64 oracle over the CPU cache.
inline void expect_decode_matches_oracle(const kvcompact::tq::TurboQuantCache& cpu, tq::DeviceCache& gpu,
                                         std::uint32_t layer, std::uint32_t q_heads, std::mt19937_64& rng,
                                         void* stream = nullptr, const std::string& where = "") {
  const std::uint32_t d = gpu.head_dim(), sequences = gpu.sequences();
  auto plan = take(gpu.plan_decode(layer, q_heads, gpu.capacity()));
  auto ws = take(DeviceBuffer::allocate(plan.workspace_bytes));
  const auto q = kvcompact::tq::testing::random_rows(rng, std::size_t{sequences} * q_heads, d, 1.0f, false);
  auto dq = take(DeviceBuffer::allocate(q.size() * 4));
  ASSERT_TRUE(dq.upload(q.data(), q.size() * 4).ok());
  auto dout = take(DeviceBuffer::allocate(q.size() * 4));
  ASSERT_TRUE(dout.fill(0xFF).ok());
  const Status s = gpu.decode(layer, plan, static_cast<const float*>(dq.data()), nullptr, 0.0f,
                              static_cast<float*>(dout.data()), ws.data(), stream);
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  ASSERT_TRUE(synchronize(stream).ok());
  std::vector<float> out(q.size());
  ASSERT_TRUE(dout.download(out.data(), out.size() * 4).ok());
  expect_decode_output_matches_oracle(cpu, layer, q_heads, q, out, where);
}

}  // namespace kvcompact::cuda::testing
