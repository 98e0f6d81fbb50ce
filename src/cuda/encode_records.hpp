// Internal, host only: encode_append_batch without the exact-window ring writes, for DeviceCache. Its commit
// kernel (append_commit.hpp) writes the ring rows of the requests the encode accepted, after reading their
// verdicts, so a rejected append leaves the ring — and so the visible window — exactly as it was, as the CPU
// cache does. `at` / `check`: the DeviceLengths / PositionCheck of the public overloads (null: neither; not
// both). Checks, launches, records and status words are those of encode_append_batch.
#pragma once

#include <span>

#include "append_commit.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/error.hpp"
#include "kvcompact/cuda/tq.hpp"

namespace kvcompact::cuda::tq::detail {

Status encode_records_batch(const LayerLayout& layout, const DeviceCodec& codec, void* layer_data,
                            std::span<const EncodeRequest> requests, const DeviceLengths* at,
                            const PositionCheck* check, void* stream);

// The commit kernel's view of a request this encode accepted the checks of (its dtype f32, f16 or bf16, as
// EncodeParams::dtype's code).
inline CommitRequest commit_request(const EncodeRequest& r) {
  const std::uint32_t dtype = r.dtype == DType::F32 ? 0u : r.dtype == DType::F16 ? 1u : 2u;
  return CommitRequest{r.keys, r.values, r.status, r.seq, r.position, r.rows, dtype};
}

}  // namespace kvcompact::cuda::tq::detail
