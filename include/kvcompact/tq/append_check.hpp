// The argument checks of an append, shared by every TurboQuant cache (the CPU TurboQuantCache and the
// GPU-resident cuda::tq::DeviceCache), so both reject the same calls with the same typed errors in the same
// order. The caches check the layer / sequence indices themselves (their layer tables differ).
#pragma once

#include <cstdint>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/error.hpp"

namespace kvcompact::tq {

// In order: position must equal the current length (OutOfRange, expected = length, actual = position);
// position + rows ≤ capacity (CapacityExceeded, expected = capacity, actual = position + rows); then, only
// when rows > 0: dtype F32 / F16 / BF16 (Unsupported) and non-null keys and values (InvalidArgument).
// An append of 0 rows passes (and stores nothing) whatever its dtype and pointers.
Status validate_append(std::uint32_t layer, std::uint32_t seq, std::uint32_t length, std::uint32_t capacity,
                       std::uint32_t position, std::uint32_t rows, DType dtype, const void* keys,
                       const void* values);

}  // namespace kvcompact::tq
