// Shared helpers of the CUDA GPU tests (tests/cuda, tests/cuda_dsv4): the skip-without-device macro, status
// assertions, unwrapping of Results, and rows converted to an input dtype. Every GPU test skips with a message
// when no CUDA device is present, so CI (nvcc, no GPU) runs the binaries as skips.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

#define SKIP_WITHOUT_GPU()                                                                                         \
  do {                                                                                                             \
    if (::kvcompact::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)"; \
  } while (0)

#define ASSERT_OK(expr)                                                      \
  do {                                                                       \
    const auto& kvc_r_ = (expr);                                             \
    ASSERT_TRUE(kvc_r_.ok()) << #expr << ": " << kvc_r_.error().to_string(); \
  } while (0)

// The same as a non-fatal check, for helpers that return a value.
#define EXPECT_OK(expr)                                                      \
  do {                                                                       \
    const auto& kvc_r_ = (expr);                                             \
    EXPECT_TRUE(kvc_r_.ok()) << #expr << ": " << kvc_r_.error().to_string(); \
  } while (0)

namespace kvcompact::cuda::testing {

// InvalidArgument whose message names `field` (the plan checks' refusals of hand-edited fields).
inline ::testing::AssertionResult refused_naming(const Status& st, const std::string& field) {
  if (st.ok()) return ::testing::AssertionFailure() << "accepted (expected an error naming " << field << ")";
  if (st.error().code != ErrorCode::InvalidArgument || st.error().message.find(field) == std::string::npos) {
    return ::testing::AssertionFailure() << "got " << st.error().to_string() << " (expected InvalidArgument naming "
                                         << field << ")";
  }
  return ::testing::AssertionSuccess();
}

// The value of a Result, with a test failure (not an abort) when it holds an error.
template <typename T>
T take(Result<T>&& r) {
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return std::move(r).value();
}

// Rows as the bytes of `dtype` (F32 copies; F16 / BF16 round to nearest even).
inline std::vector<std::uint8_t> to_dtype(const std::vector<float>& rows, DType dtype) {
  std::vector<std::uint8_t> out;
  if (dtype == DType::F32) {
    out.resize(rows.size() * 4);
    std::memcpy(out.data(), rows.data(), out.size());
    return out;
  }
  out.resize(rows.size() * 2);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::uint16_t h = dtype == DType::F16 ? f32_to_f16(rows[i]) : f32_to_bf16(rows[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

// A one-layer CPU cache (capacity `capacity`) whose sequence s holds lengths[s] random tokens: keys with
// outlier channels, then values, drawn per sequence in that order.
inline kvcompact::tq::TurboQuantCache random_cpu_cache(std::mt19937_64& rng, const kvcompact::tq::QuantConfig& config,
                                                       std::uint32_t d, std::uint32_t kv_heads,
                                                       const std::vector<std::uint32_t>& lengths,
                                                       std::uint32_t capacity) {
  using kvcompact::tq::testing::random_rows;
  kvcompact::tq::CacheShape shape;
  shape.head_dim = d;
  shape.kv_heads = {kv_heads};
  shape.sequences = static_cast<std::uint32_t>(lengths.size());
  shape.capacity = capacity;
  auto cache = take(kvcompact::tq::TurboQuantCache::create(shape, config));
  for (std::uint32_t s = 0; s < shape.sequences; ++s) {
    const auto k = random_rows(rng, std::size_t{lengths[s]} * kv_heads, d, 1.0f, true);
    const auto v = random_rows(rng, std::size_t{lengths[s]} * kv_heads, d, 1.0f, false);
    const Status st = cache.append(0, s, 0, lengths[s], DType::F32, k.data(), v.data());
    EXPECT_TRUE(st.ok()) << "append: " << (st.ok() ? "" : st.error().to_string());
  }
  return cache;
}

// A device copy of a CPU layer's bytes in a buffer of layer_buffer_bytes (planned bytes + slack).
inline DeviceBuffer upload_layer(const kvcompact::tq::LayerView& view) {
  auto layer = take(DeviceBuffer::allocate(tq::layer_buffer_bytes(*view.layout)));
  const Status st = layer.upload(view.data, view.layout->total_bytes);
  EXPECT_TRUE(st.ok()) << "upload: " << (st.ok() ? "" : st.error().to_string());
  return layer;
}

}  // namespace kvcompact::cuda::testing
