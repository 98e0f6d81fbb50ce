// Internal: the fast encode kernel's division check (docs/cuda-encode.md, float op 3), compiled for the device
// (tq_encode.cu) and for the host (tests/cuda/encode_division_test.cpp checks it against the CPU codec's
// float64 division on the CPU). The CPU computes y = float(x / ‖x‖) in float64; the kernel forms x·(rh + rl)
// with r = RN(1/‖x‖) split into floats rh = f32(r), rl = f32(r − rh), and takes the result only where it
// provably equals the CPU's.
//
// Why it is exact: pr = RN(x·rh), er = x·rh − pr (exact by fma), tt = RN(x·rl + er), so pr + tt = x/‖x‖ ·
// (1 + ε) with |ε| < 2⁻⁴⁶ for ‖x‖ in [2⁻⁶⁰, 2⁶⁰] (rh, rl normal). The estimate perturbed by ±δ, δ = |x·rd| =
// 2⁻⁴²·|x·rh| (rd = rh·2⁻⁴², exact), brackets both the exact quotient and its float64 rounding with about ten
// times the estimate's error to spare; when both ends round to the same float ya == yb, round-to-nearest maps
// the whole bracket, so also the CPU's double-rounded value, to ya. Tiny products (|pr| < 2⁻¹⁰⁰ with x ≠ 0),
// where er could lose bits to underflow, are never accepted; the caller divides in float64 instead.
#pragma once

#ifndef __CUDACC__
#include <cmath>
#endif

#ifdef __CUDACC__
#define KVC_ENCODE_HD __host__ __device__ __forceinline__
#else
#define KVC_ENCODE_HD inline
#endif

namespace kvcompact::cuda::tq::detail {

// One IEEE operation each, round to nearest (the host build has no FMA contraction: no -march / -mfma flags,
// and the test target adds -ffp-contract=off).
KVC_ENCODE_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVC_ENCODE_HD float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVC_ENCODE_HD float fma_rn(float a, float b, float c) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}

struct CheckedQuotient {
  float value;
  bool exact;  // value is float(x / ‖x‖) computed in float64
};

// rd = rh · 2⁻⁴² (exact for the norms the fast path takes). tt ± δ is one fma each: ±x·rd covers both signs
// whatever x's. The three compares combine bitwise (not short-circuit), so the compiler keeps them in predicates.
KVC_ENCODE_HD CheckedQuotient checked_quotient(float x, float rh, float rl, float rd) {
  const float pr = mul_rn(x, rh);
  const float er = fma_rn(x, rh, -pr);
  const float tt = fma_rn(x, rl, er);
  const float ya = add_rn(pr, fma_rn(x, rd, tt));
  const float yb = add_rn(pr, fma_rn(-x, rd, tt));
  return {ya, static_cast<bool>((ya == yb) & ((std::fabs(pr) >= 0x1p-100f) | (x == 0.0f)))};
}

}  // namespace kvcompact::cuda::tq::detail

#undef KVC_ENCODE_HD
