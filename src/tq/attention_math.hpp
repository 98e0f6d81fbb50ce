// Internal to the CPU attention (attention.cpp, included there only: an anonymous namespace): its block sizes and
// the vector helpers its kernels share.
#pragma once

#include <cstdint>
#include <limits>

namespace kvcompact::tq {

namespace {

constexpr std::uint32_t kBlockTokens = 64;  // tokens scored before one online-softmax update
constexpr std::uint32_t kRowBlock = 16;     // query rows that share one pass over the keys
constexpr std::uint32_t kDefaultMinChunk = 1024;  // shortest key chunk: amortises per-item tables and the merge
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Eight independent partial sums so the compiler can vectorise without reassociating on its own.
inline float dot(const float* a, const float* b, std::uint32_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::uint32_t j = 0; j < d; j += 8) {
    for (std::uint32_t k = 0; k < 8; ++k) acc[k] += a[j + k] * b[j + k];
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

inline void axpy(float w, const float* x, float* y, std::uint32_t d) {
  for (std::uint32_t j = 0; j < d; ++j) y[j] += w * x[j];
}

inline void scale_in_place(float s, float* y, std::uint32_t d) {
  for (std::uint32_t j = 0; j < d; ++j) y[j] *= s;
}

}  // namespace
}  // namespace kvcompact::tq
