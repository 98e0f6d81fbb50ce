// Internal: the device-side commit of DeviceCache::append_deferred (tq_cache_deferred.cpp), so that a decode
// step's appends need no wait per layer. After a request's encode on the same stream, the kernel reads its status
// word and either advances the sequence's device length (accepted) or moves its window start to the length
// (rejected: the encode may have overwritten ring slots), records the verdict for finish_appends and zeroes the
// status word for the next step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "encode_params.hpp"

namespace kvcompact::cuda::tq::detail {

// requests: up to any count (launched kEncodeBatchMax per block); each request's `status` points into a buffer
// whose word `verdict_offset` elements further on receives the verdict. lengths / window_begins: the layer's
// device copies ([sequences] each; window_begins null without an exact window). Requests of 0 rows are skipped.
cudaError_t launch_commit_appends(const EncodeSegment* requests, std::uint32_t count, std::uint32_t* lengths,
                                  std::uint32_t* window_begins, std::uint32_t verdict_offset, cudaStream_t stream);

}  // namespace kvcompact::cuda::tq::detail
