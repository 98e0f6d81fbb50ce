// Internal: the 16-byte chunks a bulk copy (bulk_copy.cuh) takes to cover a run of packed records, and round16.
// Host-compilable (plain C++ when not built by nvcc), so the arithmetic is unit-tested on the CPU
// (tests/cuda/region_span_test.cpp).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KVC_SPAN_HD __host__ __device__
#else
#define KVC_SPAN_HD
#endif

namespace kvcompact::cuda::tq::detail {

// x rounded up to a multiple of 16 (the bulk copies' granularity; the staging areas' region sizes).
KVC_SPAN_HD constexpr std::uint32_t round16(std::uint32_t x) { return (x + 15u) & ~15u; }

// Records of `bpt` bytes, `tokens` of them, from byte address `start`: the chunks start at the 16-byte boundary
// at or below `start` (the records then sit `start % 16` bytes into the copy) and end at the first 16-byte
// boundary at or past the last record's end, so a copy reads at most 15 bytes before and 15 after the records.
struct RegionSpan {
  std::uintptr_t aligned;  // the first chunk's address
  std::uint32_t bytes;     // a multiple of 16
};
KVC_SPAN_HD inline RegionSpan region_span(std::uintptr_t start, std::uint32_t tokens, std::uint32_t bpt) {
  const std::uintptr_t aligned = start & ~static_cast<std::uintptr_t>(15);
  const std::uint32_t bytes = static_cast<std::uint32_t>(start - aligned) + tokens * bpt;
  return RegionSpan{aligned, round16(bytes)};
}

}  // namespace kvcompact::cuda::tq::detail

#undef KVC_SPAN_HD
