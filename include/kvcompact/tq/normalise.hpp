// How the codec turns a row x into the unit vector it rotates and quantises (docs/turboquant.md, "Encode
// arithmetic"). Shared by the CPU codec (src/tq/codec.cpp) and the CUDA encode kernels (src/cuda/encode_*.cuh),
// which must write the same bytes; C++17 and host / device compilable for that reason.
//
// With n = ‖x‖ in float64 (the exact squares summed in float64), u_j = RN32(x_j · r) where r = RN32(RN64(1 / n)),
// for n in [2⁻¹²⁰, 2¹²⁰] (r is then a normal float). Outside that range — rows of extreme magnitude, never model
// data — u_j = RN32(RN64(x_j / n)). One float multiplication per coordinate: until 2026-12-01 every coordinate
// took the float64 division, which the GPU could only reproduce with a float-float product and a rounding check
// (≈ 10 instructions per coordinate). u_j is within 1.5 float ulps of x_j / n either way.
#pragma once

#if defined(__CUDACC__)
#define KVC_NORMALISE_HD __host__ __device__ __forceinline__
#else
#define KVC_NORMALISE_HD inline
#endif

namespace kvcompact::tq {

inline constexpr double kProductNormMin = 0x1p-120;
inline constexpr double kProductNormMax = 0x1p120;

// Whether a row of float64 norm `norm` (> 0, finite) normalises by the float product.
KVC_NORMALISE_HD bool normalises_by_product(double norm) {
  return norm >= kProductNormMin && norm <= kProductNormMax;
}

// r = RN32(RN64(1 / n)).
KVC_NORMALISE_HD float unit_reciprocal(double norm) { return static_cast<float>(1.0 / norm); }

// u = RN32(x · r): one rounding (the device form cannot be fused into a neighbouring addition).
KVC_NORMALISE_HD float unit_coordinate(float x, float reciprocal) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, reciprocal);
#else
  return x * reciprocal;
#endif
}

// u = RN32(RN64(x / n)): rows outside [kProductNormMin, kProductNormMax].
KVC_NORMALISE_HD float unit_coordinate_f64(float x, double norm) {
  return static_cast<float>(static_cast<double>(x) / norm);
}

}  // namespace kvcompact::tq

#undef KVC_NORMALISE_HD
