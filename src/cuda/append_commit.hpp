// Internal: the device-side commit of DeviceCache's appends — append_batch (tq_cache.cpp: the host waits after
// it and mirrors its verdicts) and those the host does not wait for, append_deferred (tq_cache_deferred.cpp) and
// append_at_length (tq_cache_device_lengths.cpp). After the requests' encodes on the same stream (which write
// the records past the visible length and leave the exact-window ring alone: encode_records.hpp), the kernel
// reads each request's status word. Accepted: it writes the request's last min(rows, W) input rows, widened to
// f32, to the ring slots position mod W and advances the sequence's device length. Rejected (NaN / inf, a norm
// beyond float32, the length limit, a stale position): nothing changes, so what stays visible is exactly what
// the CPU cache keeps after a refused append (before 2026-12-05 the encode wrote the ring itself, and a rejected
// append had to move the window start to the length). It records the verdict and zeroes the status word for the
// next step.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "encode_params.hpp"

namespace kvcompact::cuda::tq::detail {

// The layer's exact-window ring ([sequences][kv_heads][window][head_dim] f32 for keys, the same for values).
struct CommitRing {
  std::uint8_t* layer = nullptr;
  std::uint64_t keys_offset = 0, values_offset = 0;
  std::uint32_t window = 0;  // 0: no exact window, nothing to write
  std::uint32_t kv_heads = 0, head_dim = 0;
};

struct CommitTargets {
  std::uint32_t* lengths = nullptr;  // the layer's device lengths [sequences]
  CommitRing ring;
  // Each request's `status` points into a buffer [4][slots] (DeviceCache::step_status_): word + verdict_offset
  // receives the verdict (append_deferred; 0: not kept); with `sticky`, word + 2·slots accumulates the verdicts
  // (OR) and word + 3·slots keeps the position of the first rejected append since they were last cleared.
  std::uint32_t verdict_offset = 0;
  std::uint32_t slots = 0;
  bool sticky = false;
  // The requests' positions: their CommitRequest::position (host positions) or the device length (at_length).
  bool at_length = false;
  // Or null: a counter every launch increments, so that the host can tell whether commits ran since it last read
  // it (DeviceCache: replays of a captured append_at_length that sync_lengths has not seen).
  std::uint32_t* commits = nullptr;
};

// One request as the commit kernel sees it: the encode's request, with the input dtype the ring rows are
// widened from (EncodeParams::dtype's codes: 0 f32, 1 f16, 2 bf16). The status word's upper 16 bits must be 0
// (the encode sets only the low kStatus* bits; the kernel counts its blocks there).
struct CommitRequest {
  const void* keys = nullptr;    // [rows, kv_heads, head_dim]
  const void* values = nullptr;  // [rows, kv_heads, head_dim]
  std::uint32_t* status = nullptr;
  std::uint32_t seq = 0, position = 0, rows = 0, dtype = 0;
};

// requests: up to any count (launched kEncodeBatchMax at a time, each request on its own blocks). Requests of
// 0 rows are skipped. requests_launched (or null): on return, how many leading requests are in launches that
// succeeded — count on success; after a failed launch, the requests before it, whose commits will run (ring rows
// written, device lengths advanced) while the later ones' never do.
cudaError_t launch_commit_appends(const CommitRequest* requests, std::uint32_t count, const CommitTargets& targets,
                                  cudaStream_t stream, std::uint32_t* requests_launched = nullptr);

// For tests only: the commit launch that comes after `launches_before_failure` more successful ones (over every
// later launch_commit_appends call) returns cudaErrorLaunchOutOfResources without launching, once; a negative
// value disarms it. It lets the GPU tests drive DeviceCache's failure paths after a partly launched commit, which
// a working device never takes.
void fail_commit_launch_for_testing(int launches_before_failure);

}  // namespace kvcompact::cuda::tq::detail
