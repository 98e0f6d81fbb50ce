// Randomized Hadamard rotation: in-place Walsh–Hadamard butterflies (Sylvester order, strides 1, 2, 4, ...)
// per power-of-two block. Float results equal the seed system's sign → butterflies → 1/√n sequence bit for
// bit: the sign (or the inverse's 1/√n) is folded into the first stage and the other factor into the last.
#include "kvcompact/tq/rotation.hpp"

#include <bit>
#include <cmath>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "kvcompact/core/assert.hpp"
#include "kvcompact/tq/prng.hpp"

namespace kvcompact::tq {
namespace {

// Strides 1, 2 and 4 on one group of 8, in registers: the same additions in the same order as three
// separate passes, so the rounding is identical. `pre` multiplies the inputs (the signs going forward,
// 1/√n going back).
template <typename T, bool kForward>
inline void first_three_stages(const T* in, T* out, std::uint32_t n, const T* signs, T scale) {
  for (std::uint32_t g = 0; g < n; g += 8) {
    T v[8];
    for (int k = 0; k < 8; ++k) v[k] = kForward ? in[g + k] * signs[g + k] : in[g + k] * scale;
    for (int h = 1; h < 8; h *= 2) {
      for (int i = 0; i < 8; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const T a = v[j];
          const T b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
      }
    }
    for (int k = 0; k < 8; ++k) out[g + k] = v[k];
  }
}

#if defined(__SSE2__)
// SSE form of the above for float: in-lane shuffles, a sign-bit flip (exact) and adds. x + (−y) is
// x − y in IEEE arithmetic, so the results are bit-identical to the scalar form.
template <bool kForward>
inline void first_three_stages_sse(const float* in, float* out, std::uint32_t n, const float* signs, float scale) {
  const __m128 flip_odd = _mm_set_ps(-0.0f, 0.0f, -0.0f, 0.0f);   // lanes 1, 3
  const __m128 flip_high = _mm_set_ps(-0.0f, -0.0f, 0.0f, 0.0f);  // lanes 2, 3
  const __m128 scale4 = _mm_set1_ps(scale);
  auto stages12 = [&](__m128 v) {
    // stride 1: [v0+v1, v0−v1, v2+v3, v2−v3]
    v = _mm_add_ps(_mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 2, 0, 0)),
                   _mm_xor_ps(_mm_shuffle_ps(v, v, _MM_SHUFFLE(3, 3, 1, 1)), flip_odd));
    // stride 2: [v0+v2, v1+v3, v0−v2, v1−v3]
    return _mm_add_ps(_mm_shuffle_ps(v, v, _MM_SHUFFLE(1, 0, 1, 0)),
                      _mm_xor_ps(_mm_shuffle_ps(v, v, _MM_SHUFFLE(3, 2, 3, 2)), flip_high));
  };
  for (std::uint32_t g = 0; g < n; g += 8) {
    __m128 a = _mm_loadu_ps(in + g);
    __m128 b = _mm_loadu_ps(in + g + 4);
    if constexpr (kForward) {
      a = _mm_mul_ps(a, _mm_loadu_ps(signs + g));
      b = _mm_mul_ps(b, _mm_loadu_ps(signs + g + 4));
    } else {
      a = _mm_mul_ps(a, scale4);
      b = _mm_mul_ps(b, scale4);
    }
    a = stages12(a);
    b = stages12(b);
    _mm_storeu_ps(out + g, _mm_add_ps(a, b));  // stride 4
    _mm_storeu_ps(out + g + 4, _mm_sub_ps(a, b));
  }
}
#endif

// The final stage (stride n/2) also applies the other factor: ·1/√n going forward, ·signs going back.
template <typename T, bool kForward>
inline T last_factor(const T* signs, std::uint32_t index, T scale) {
  if constexpr (kForward) {
    (void)signs;
    (void)index;
    return scale;
  } else {
    (void)scale;
    return signs[index];
  }
}

// One block of n (a power of two, ≥ 16) coordinates. Forward: out = H·(signs ⊙ in)·scale.
// Inverse: out = signs ⊙ (H·(in·scale)). `in` may equal `out`.
template <typename T, bool kForward>
void rotate_block(const T* in, T* out, std::uint32_t n, const T* signs, T scale) {
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    first_three_stages_sse<kForward>(in, out, n, signs, scale);
  } else {
    first_three_stages<T, kForward>(in, out, n, signs, scale);
  }
#else
  first_three_stages<T, kForward>(in, out, n, signs, scale);
#endif
  // Strides 8 .. n/2 over contiguous runs (these vectorise), two stages per pass while two remain:
  // stride h then 2h on the same four runs, in the same order as two passes.
  std::uint32_t h = 8;
  for (; 4 * h <= n; h *= 4) {
    const bool last = 4 * h == n;
    for (std::uint32_t i = 0; i < n; i += 4 * h) {
      T* __restrict r0 = out + i;
      T* __restrict r1 = out + i + h;
      T* __restrict r2 = out + i + 2 * h;
      T* __restrict r3 = out + i + 3 * h;
      if (!last) {
        for (std::uint32_t j = 0; j < h; ++j) {
          const T a = r0[j] + r1[j], b = r0[j] - r1[j], c = r2[j] + r3[j], d = r2[j] - r3[j];
          r0[j] = a + c;
          r2[j] = a - c;
          r1[j] = b + d;
          r3[j] = b - d;
        }
      } else if constexpr (kForward) {
        for (std::uint32_t j = 0; j < h; ++j) {
          const T a = r0[j] + r1[j], b = r0[j] - r1[j], c = r2[j] + r3[j], d = r2[j] - r3[j];
          r0[j] = (a + c) * scale;
          r2[j] = (a - c) * scale;
          r1[j] = (b + d) * scale;
          r3[j] = (b - d) * scale;
        }
      } else {
        const T* s0 = signs + i;
        const T* s1 = signs + i + h;
        const T* s2 = signs + i + 2 * h;
        const T* s3 = signs + i + 3 * h;
        for (std::uint32_t j = 0; j < h; ++j) {
          const T a = r0[j] + r1[j], b = r0[j] - r1[j], c = r2[j] + r3[j], d = r2[j] - r3[j];
          r0[j] = (a + c) * s0[j];
          r2[j] = (a - c) * s2[j];
          r1[j] = (b + d) * s1[j];
          r3[j] = (b - d) * s3[j];
        }
      }
    }
  }
  if (2 * h == n) {  // one stage left (stride n/2), which is the last
    T* __restrict lo = out;
    T* __restrict hi = out + h;
    for (std::uint32_t j = 0; j < h; ++j) {
      const T a = lo[j];
      const T b = hi[j];
      lo[j] = (a + b) * last_factor<T, kForward>(signs, j, scale);
      hi[j] = (a - b) * last_factor<T, kForward>(signs, j + h, scale);
    }
  }
}

template <typename T, bool kForward>
void rotate_all(const T* in, T* out, std::span<const std::uint32_t> blocks, std::span<const std::uint32_t> offsets,
                const T* signs, const T* scales) {
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const std::uint32_t o = offsets[k];
    rotate_block<T, kForward>(in + o, out + o, blocks[k], signs + o, scales[k]);
  }
}

}  // namespace

Result<Rotation> Rotation::create(std::uint32_t head_dim, std::uint64_t stream_seed) {
  // Same rule as validate_head_dim (tq/layout.hpp): every block of the binary decomposition is then
  // a power of two ≥ 16, which the butterfly kernel relies on.
  if (head_dim < 16 || head_dim > 1024 || head_dim % 16 != 0) {
    return make_error(ErrorCode::InvalidArgument,
                      "head_dim {} is not supported by the TurboQuant rotation: it must be a multiple of 16 in "
                      "[16, 1024]",
                      head_dim);
  }
  Rotation rotation;
  rotation.head_dim_ = head_dim;
  rotation.stream_seed_ = stream_seed;
  rotation.signs_.resize(head_dim);
  rotation.signs_f64_.resize(head_dim);
  Xoshiro256StarStar rng(stream_seed);
  for (std::uint32_t i = 0; i < head_dim; ++i) {
    const bool plus = (rng.next_u64() & 1u) == 1u;
    rotation.signs_[i] = plus ? 1.0f : -1.0f;
    rotation.signs_f64_[i] = plus ? 1.0 : -1.0;
  }
  std::uint32_t offset = 0;
  for (std::uint32_t bit = 1u << 10; bit >= 16; bit >>= 1) {
    if ((head_dim & bit) == 0) continue;
    rotation.blocks_.push_back(bit);
    rotation.offsets_.push_back(offset);
    // The seed computes 1/√n in f32 (1.0f / sqrtf(n)); doing the same keeps the float path bit-identical.
    rotation.scales_.push_back(1.0f / std::sqrt(static_cast<float>(bit)));
    rotation.scales_f64_.push_back(1.0 / std::sqrt(static_cast<double>(bit)));
    offset += bit;
  }
  KVC_ASSERT(offset == head_dim, "rotation blocks must cover head_dim");
  return rotation;
}

void Rotation::forward(std::span<const float> x, std::span<float> y) const {
  KVC_ASSERT(x.size() == head_dim_ && y.size() == head_dim_, "rotation span size must equal head_dim");
  rotate_all<float, true>(x.data(), y.data(), blocks_, offsets_, signs_.data(), scales_.data());
}

void Rotation::inverse(std::span<const float> y, std::span<float> x) const {
  KVC_ASSERT(x.size() == head_dim_ && y.size() == head_dim_, "rotation span size must equal head_dim");
  rotate_all<float, false>(y.data(), x.data(), blocks_, offsets_, signs_.data(), scales_.data());
}

void Rotation::forward(std::span<const double> x, std::span<double> y) const {
  KVC_ASSERT(x.size() == head_dim_ && y.size() == head_dim_, "rotation span size must equal head_dim");
  rotate_all<double, true>(x.data(), y.data(), blocks_, offsets_, signs_f64_.data(), scales_f64_.data());
}

void Rotation::inverse(std::span<const double> y, std::span<double> x) const {
  KVC_ASSERT(x.size() == head_dim_ && y.size() == head_dim_, "rotation span size must equal head_dim");
  rotate_all<double, false>(y.data(), x.data(), blocks_, offsets_, signs_f64_.data(), scales_f64_.data());
}

double Rotation::matrix_entry(std::uint32_t row, std::uint32_t col) const {
  KVC_ASSERT(row < head_dim_ && col < head_dim_, "matrix_entry index out of range");
  for (std::size_t k = 0; k < blocks_.size(); ++k) {
    const std::uint32_t lo = offsets_[k];
    const std::uint32_t hi = lo + blocks_[k];
    if (row < lo || row >= hi) continue;
    if (col < lo || col >= hi) return 0.0;
    const int parity = std::popcount((row - lo) & (col - lo)) & 1;
    return (parity ? -1.0 : 1.0) * signs_f64_[col] / std::sqrt(static_cast<double>(blocks_[k]));
  }
  return 0.0;
}

}  // namespace kvcompact::tq
