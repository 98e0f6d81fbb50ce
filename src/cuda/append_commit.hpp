// Internal: the device-side commit of DeviceCache's appends — append_batch (tq_cache.cpp: the host waits after
// it and mirrors its verdicts) and those the host does not wait for, append_deferred (tq_cache_deferred.cpp) and
// append_at_length (tq_cache_device_lengths.cpp). After a request's encode on the
// same stream, the kernel reads its status word and either advances the sequence's device length (accepted) or
// leaves it; a request rejected for its input (NaN / inf, a norm beyond float32) moves the window start to the
// length (the encode may have overwritten ring slots), one refused at the length limit wrote nothing. It
// records the verdict and zeroes the status word for the next step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "encode_params.hpp"

namespace kvcompact::cuda::tq::detail {

struct CommitTargets {
  std::uint32_t* lengths = nullptr;        // the layer's device lengths [sequences]
  std::uint32_t* window_begins = nullptr;  // [sequences]; null without an exact window
  // Each request's `status` points into a buffer [4][slots] (DeviceCache::step_status_): word + verdict_offset
  // receives the verdict (append_deferred; 0: not kept); with `sticky`, word + 2·slots accumulates the verdicts
  // (OR) and word + 3·slots keeps the position of the first rejected append since they were last cleared.
  std::uint32_t verdict_offset = 0;
  std::uint32_t slots = 0;
  bool sticky = false;
  // The requests' positions: their EncodeSegment::position (host positions) or the device length (at_length).
  bool at_length = false;
  // Or null: a counter every launch increments, so that the host can tell whether commits ran since it last read
  // it (DeviceCache: replays of a captured append_at_length that sync_lengths has not seen).
  std::uint32_t* commits = nullptr;
};

// requests: up to any count (launched kEncodeBatchMax per block). Requests of 0 rows are skipped.
cudaError_t launch_commit_appends(const EncodeSegment* requests, std::uint32_t count, const CommitTargets& targets,
                                  cudaStream_t stream);

}  // namespace kvcompact::cuda::tq::detail
