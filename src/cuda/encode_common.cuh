// Internal to the encode kernels (tq_encode.cu): what both kernels share — the float32 maximum a stored norm may
// reach and a request's verdict against its sequence's device length. Included by tq_encode.cu only (an anonymous
// namespace: one translation unit's kernels).
#pragma once

#include <cstdint>

#include "encode_params.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {

constexpr float kFloatMax = 3.40282346638528859812e38f;

// A request's verdict against its sequence's device length (EncodeParams::device_lengths set), shared by both
// kernels: with a position check (PositionCheck) it writes at its own position, or nothing when that is not the
// device length (kStatusStalePosition); otherwise (DeviceLengths) it writes at the device length, or nothing
// when it would end beyond the limit (kStatusBeyondLimit).
struct LengthVerdict {
  std::uint32_t first;    // the position of its first row
  std::uint32_t refusal;  // 0, or the status bit of a request that writes nothing
};
__device__ inline LengthVerdict length_verdict(const EncodeParams& p, std::uint32_t device_length,
                                               std::uint32_t position, std::uint32_t rows) {
  if (p.check_positions != 0) return {position, device_length != position ? kStatusStalePosition : 0u};
  const bool beyond = device_length > p.length_limit || rows > p.length_limit - device_length;
  return {device_length, beyond ? kStatusBeyondLimit : 0u};
}

}  // namespace
}  // namespace kvcompact::cuda::tq::detail
