// Internal: the warpgroup prefill producer's code arithmetic (prefill_dequant.cuh) — where a thread's groups of 8
// codes sit in a staged code row and which pair-table entries they look up. Host-compilable (plain C++ when not
// built by nvcc), so that it is unit-tested on the CPU against the codec's read_code
// (tests/cuda/prefill_codes_test.cpp); on the device the 4-bit pairs are byte permutes.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVC_CODES_HD __host__ __device__ __forceinline__
#else
#define KVC_CODES_HD inline
#endif

namespace kvcompact::cuda::tq::detail::prefill {

// A thread's code groups: one group of 8 coordinates (8 · kBits bits, the first coordinate lowest) per token it
// handles, `at(step)` bytes past its first group (a multiple of 4 bytes: whole rows of 16·kBits bytes).
template <unsigned kBits>
struct CodeGroups {
  const std::uint8_t* first;  // the first group's byte (4-, 2- or 1-byte aligned for 4, 2 and 1 bits)
  std::uint32_t shift;        // 3 and 5 bits: the first group's bit offset in its aligned word (fixed per thread)

  KVC_CODES_HD explicit CodeGroups(const std::uint8_t* group) {
    if constexpr (kBits == 3 || kBits == 5) {
      // (Stepping back by a byte count keeps the pointer's shared-memory provenance: loads stay LDS.)
      const std::uint32_t misalign = static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(group) & 3u);
      first = group - misalign;
      shift = 8u * misalign;
    } else {
      first = group;
      shift = 0;
    }
  }
  KVC_CODES_HD std::uint64_t at(std::uint32_t step) const {
    if constexpr (kBits == 4) {
      return *reinterpret_cast<const std::uint32_t*>(first + step);
    } else if constexpr (kBits == 2) {
      return *reinterpret_cast<const unsigned short*>(first + step);
    } else if constexpr (kBits == 1) {
      return first[step];
    } else {  // 3 or 5 bits: the group spans at most two aligned words (3 + 5 bytes ≤ 8)
      const std::uint32_t* w = reinterpret_cast<const std::uint32_t*>(first + step);
      return (w[0] | (std::uint64_t{w[1]} << 32)) >> shift;
    }
  }
};

// The pair-table entries of a group's four coordinate pairs: pair k is the 2·kBits bits at 2k·kBits (entry = code
// of the higher coordinate · 2^kBits + code of the lower one). For 4 bits the pairs are the group's bytes, each
// taken by one byte permute (the table lookup's scaled address then costs one LEA).
template <unsigned kBits>
KVC_CODES_HD void pair_entries(std::uint64_t bits, std::uint32_t (&e)[4]) {
  if constexpr (kBits == 4) {
    const std::uint32_t x = static_cast<std::uint32_t>(bits);
    for (unsigned k = 0; k < 4; ++k) {
#ifdef __CUDA_ARCH__
      e[k] = __byte_perm(x, 0u, 0x4440u + k);  // byte k, zero-extended
#else
      e[k] = (x >> (8u * k)) & 0xFFu;
#endif
    }
  } else {
    constexpr std::uint64_t kMask = (std::uint64_t{1} << (2u * kBits)) - 1u;
    for (unsigned k = 0; k < 4; ++k) e[k] = static_cast<std::uint32_t>((bits >> (2u * k * kBits)) & kMask);
  }
}

}  // namespace kvcompact::cuda::tq::detail::prefill

#undef KVC_CODES_HD
