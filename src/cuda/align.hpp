// Internal, host side: the 256-byte rounding of workspace regions. A workspace (or device buffer) from
// cudaMalloc starts on a 256-byte boundary; every region inside it that starts on one too is aligned for the
// widest vector and bulk-copy accesses of any kernel that reads it, whatever the sizes of the regions before it.
#pragma once

#include <cstdint>

namespace kvcompact::cuda::detail {

constexpr std::uint64_t align256(std::uint64_t bytes) { return (bytes + 255u) & ~std::uint64_t{255}; }

}  // namespace kvcompact::cuda::detail
