// DeviceCache's appends at the device-resident lengths (append_at_length / sync_lengths): a decode step whose
// kernels read each sequence's position when they run, so one captured CUDA graph appends and attends at the
// right place on every replay. The encode refuses rows that would end beyond the caller's max_length
// (kEncodeBeyondLimit); the commit kernel (append_commit.hpp) advances the device length of each accepted
// request and keeps the refusals until sync_lengths brings the lengths back to the host (docs/cuda.md,
// "DeviceCache").
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "append_commit.hpp"
#include "check.hpp"
#include "device_cache_layer.hpp"
#include "encode_records.hpp"
#include "encode_params.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/append_check.hpp"

namespace kvcompact::cuda::tq {

namespace ktq = kvcompact::tq;

namespace {

// append_at_length's host checks of one request (the layer and max_length are checked before).
Status check_length_append(std::uint32_t layer, const LengthAppend& r, std::uint32_t max_length) {
  if (r.rows > max_length) {
    return make_error(ErrorCode::CapacityExceeded,
                      "append_at_length of {} rows to layer {} sequence {} exceeds its max_length {}", r.rows, layer,
                      r.seq, max_length);
  }
  // The shared append checks for the rest (dtype, pointers): the position and capacity they check first are
  // the device's business here, so they are given values that pass.
  return ktq::validate_append(layer, r.seq, 0, std::numeric_limits<std::uint32_t>::max(), 0, r.rows, r.dtype, r.keys,
                              r.values);
}

}  // namespace

Status DeviceCache::check_host_lengths(const char* operation, void* stream) const {
  KVC_TRY(check_no_pending_appends(operation));
  if (lengths_on_device_) {
    return make_error(ErrorCode::InvalidArgument,
                      "{} while the lengths live on the device (append_at_length since the last sync_lengths): call "
                      "sync_lengths first",
                      operation);
  }
  if (!at_length_used_) return ok_status();
  // Replays of a captured append_at_length advance the device lengths without the host knowing: they show in
  // the commit counter (the word after the status parts), which sync_lengths and reset_all take as seen.
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t slots = layers_.size() * std::size_t{sequences_};
  std::uint32_t commits = 0;
  cudaError_t err = cudaMemcpyAsync(&commits, static_cast<const std::uint32_t*>(step_status_.data()) + 4 * slots, 4,
                                    cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) {
    return make_error(ErrorCode::Internal, "{}: reading the commit counter: {}", operation, cudaGetErrorString(err));
  }
  if (commits == synced_commits_) return ok_status();
  return make_error(ErrorCode::InvalidArgument,
                    "{}: append_at_length has committed on the device since the last sync_lengths (replays of a "
                    "captured step?), so the host's lengths are stale: call sync_lengths first (nothing was done)",
                    operation);
}

Status DeviceCache::check_plan_covers(std::uint32_t layer, std::uint32_t max_length) const {
  const Layer& l = *layers_[layer];
  for (std::uint32_t s = 0; s < sequences_; ++s) {
    if (l.lengths[s] > max_length) {
      return make_error(ErrorCode::OutOfRange, "sequence {} has length {} beyond the plan's max_length {}", s,
                        l.lengths[s], max_length);
    }
  }
  if (length_limits_[layer] > max_length) {
    return make_error(ErrorCode::OutOfRange,
                      "layer {} appends at the device lengths up to {} (append_at_length's max_length), beyond the "
                      "plan's max_length {}",
                      layer, length_limits_[layer], max_length);
  }
  return ok_status();
}

Status DeviceCache::append_at_length(std::uint32_t layer, std::span<const LengthAppend> requests,
                                     std::uint32_t max_length, void* stream) {
  KVC_TRY(check_no_pending_appends("append_at_length"));
  if (layer >= layers_.size()) {
    return make_error(ErrorCode::OutOfRange, "layer {} is outside the cache's {} layers", layer, layers_.size());
  }
  if (layers_[layer]->kv_heads == 0) {
    return make_error(ErrorCode::InvalidArgument, "layer {} has no attention (0 KV heads) and stores nothing", layer);
  }
  if (max_length > capacity_) {
    return make_error(ErrorCode::CapacityExceeded, "append_at_length: max_length {} exceeds the capacity {}",
                      max_length, capacity_);
  }
  std::vector<bool> seen(sequences_, false);
  for (const LengthAppend& r : requests) {
    KVC_TRY(check_layer_seq(layer, r.seq, true));
    KVC_TRY(check_length_append(layer, r, max_length));
    if (seen[r.seq]) {
      return make_error(ErrorCode::InvalidArgument, "append_at_length: sequence {} appears more than once", r.seq);
    }
    seen[r.seq] = true;
  }
  if (std::none_of(requests.begin(), requests.end(), [](const LengthAppend& r) { return r.rows > 0; })) {
    return ok_status();
  }
  Layer& l = *layers_[layer];
  auto* status = static_cast<std::uint32_t*>(step_status_.data()) + std::size_t{layer} * sequences_;
  std::vector<EncodeRequest> encodes;
  std::vector<detail::CommitRequest> commits;
  for (const LengthAppend& r : requests) {
    if (r.rows == 0) continue;
    // (position: not read; the kernels append at the device length)
    encodes.push_back(EncodeRequest{r.seq, 0, r.rows, r.dtype, r.keys, r.values, status + r.seq});
    commits.push_back(detail::commit_request(encodes.back()));
  }
  lengths_on_device_ = true;
  at_length_used_ = true;
  length_limits_[layer] = std::max(length_limits_[layer], max_length);
  // The ring rows wait for the commit kernel's verdicts (encode_records.hpp).
  const DeviceLengths at{l.device_lengths(), max_length};
  Status launched = detail::encode_records_batch(l.layout, *l.codec, l.data.data(), encodes, &at, nullptr, stream);
  std::uint32_t commits_launched = 0;  // leading entries of `commits` whose launch succeeded
  if (launched.ok()) {
    detail::CommitTargets targets = l.commit_targets();
    targets.slots = static_cast<std::uint32_t>(layers_.size() * std::size_t{sequences_});
    targets.sticky = true;
    targets.at_length = true;
    targets.commits = static_cast<std::uint32_t*>(step_status_.data()) + 4 * targets.slots;
    const cudaError_t err =
        detail::launch_commit_appends(commits.data(), static_cast<std::uint32_t>(commits.size()), targets,
                                      static_cast<cudaStream_t>(stream), &commits_launched);
    if (err != cudaSuccess) {
      launched = make_error(ErrorCode::Internal, "commit_appends launch: {}", cudaGetErrorString(err));
    }
  }
  if (!launched.ok()) {
    // The encodes that ran ORed their flags into these status words and no commit zeroed them: cleared, in stream
    // order, so that a later append of the same (layer, sequence) does not read them as its own refusal.
    const auto s = static_cast<cudaStream_t>(stream);
    for (const LengthAppend& r : requests) {
      if (r.rows > 0) (void)cudaMemsetAsync(status + r.seq, 0, sizeof(std::uint32_t), s);
    }
  }
  if (commits_launched > 0 && !launched.ok()) {
    // A commit launch failed after others ran: their requests are committed on the device (ring rows and
    // lengths, which sync_lengths brings back; every window stays valid), the later ones never will be.
    return make_error(ErrorCode::Internal,
                      "{} (the first {} of {} appends, in launches before the failed one, were committed as their "
                      "input allowed; the others were not: sync_lengths shows which)",
                      launched.error().message, commits_launched, commits.size());
  }
  return launched;
}

Status DeviceCache::sync_lengths(void* stream) {
  KVC_TRY(check_no_pending_appends("sync_lengths"));
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t slots = layers_.size() * std::size_t{sequences_};
  // Into page-locked memory: positions_ (per layer [lengths, window starts]), then the refusals ([flags, first
  // position]: step_status_ parts 2 and 3) and the commit counter after them.
  std::uint32_t* const positions = static_cast<std::uint32_t*>(sync_staging_.data());
  std::uint32_t* const refusals = positions + 2 * slots;
  cudaError_t err = cudaMemcpyAsync(positions, positions_.data(), 8ull * slots, cudaMemcpyDeviceToHost, s);
  auto* words = static_cast<std::uint32_t*>(step_status_.data());
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(refusals, words + 2 * slots, 8ull * slots + 4, cudaMemcpyDeviceToHost, s);
  }
  // Every part back to zero (no commit is in flight once the stream is done; a failed call's status words too).
  if (err == cudaSuccess) err = cudaMemsetAsync(words, 0, 16ull * slots, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) {
    return make_error(ErrorCode::Internal, "sync_lengths: {} (the host's lengths were not updated)",
                      cudaGetErrorString(err));
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = *layers_[i];
    if (l.kv_heads == 0) continue;
    const std::uint32_t* both = positions + 2 * i * sequences_;
    std::copy(both, both + sequences_, l.lengths.begin());
    std::copy(both + sequences_, both + 2 * sequences_, l.window_begins.begin());
  }
  std::fill(length_limits_.begin(), length_limits_.end(), 0u);
  lengths_on_device_ = false;
  synced_commits_ = refusals[2 * slots];
  for (std::size_t slot = 0; slot < slots; ++slot) {
    const std::uint32_t flags = refusals[slot];
    if (flags == 0) continue;
    const auto layer = static_cast<std::uint32_t>(slot / sequences_);
    const auto seq = static_cast<std::uint32_t>(slot % sequences_);
    const std::uint32_t position = refusals[slots + slot];
    if ((flags & ~kEncodeBeyondLimit) != 0) return rejected_append(layer, seq, position, flags);
    return make_error(ErrorCode::CapacityExceeded,
                      "append_at_length to layer {} sequence {} at position {}: its rows would end beyond the "
                      "call's max_length (nothing stored)",
                      layer, seq, position);
  }
  return ok_status();
}

void DeviceCache::drop_device_lengths() {
  if (!lengths_on_device_ && !at_length_used_) return;
  (void)cudaDeviceSynchronize();  // the steps' streams are the caller's: wait for all of them
  (void)step_status_.fill(0);  // the commit counter too, which is then seen at 0
  synced_commits_ = 0;
  std::fill(length_limits_.begin(), length_limits_.end(), 0u);
  lengths_on_device_ = false;
}

}  // namespace kvcompact::cuda::tq
