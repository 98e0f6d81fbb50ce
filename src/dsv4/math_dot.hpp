// The float32 dot product of the DeepSeek-V4 fast paths (attention scores, indexer scores): eight named
// accumulators, which vectorise and stay in registers in sanitizer builds too. Private to src/dsv4.
#pragma once

#include <cstddef>

namespace kvcompact::dsv4::detail {

inline float dot_f32(const float* a, const float* b, std::size_t n) {
  float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
  const std::size_t main_end = n - n % 8;
  for (std::size_t i = 0; i < main_end; i += 8) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
    s4 += a[i + 4] * b[i + 4];
    s5 += a[i + 5] * b[i + 5];
    s6 += a[i + 6] * b[i + 6];
    s7 += a[i + 7] * b[i + 7];
  }
  const float sum = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
  if (main_end == n) return sum;
  float tail = 0.0f;
  for (std::size_t k = main_end; k < n; ++k) tail += a[k] * b[k];
  return sum + tail;
}

}  // namespace kvcompact::dsv4::detail
