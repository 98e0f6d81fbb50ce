// Shared helpers of the CUDA GPU tests (tests/cuda, tests/cuda_dsv4): the skip-without-device macro, status
// assertions, unwrapping of Results, and rows converted to an input dtype. Every GPU test skips with a message
// when no CUDA device is present, so CI (nvcc, no GPU) runs the binaries as skips.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/runtime.hpp"

#define SKIP_WITHOUT_GPU()                                                                                         \
  do {                                                                                                             \
    if (::kvcompact::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)"; \
  } while (0)

#define ASSERT_OK(expr)                                                      \
  do {                                                                       \
    const auto& kvc_r_ = (expr);                                             \
    ASSERT_TRUE(kvc_r_.ok()) << #expr << ": " << kvc_r_.error().to_string(); \
  } while (0)

namespace kvcompact::cuda::testing {

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

}  // namespace kvcompact::cuda::testing
