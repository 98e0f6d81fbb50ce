// DeviceCache's deferred appends (append_deferred / finish_appends): a decode step appends to every layer
// without waiting per layer. The device commits each accepted request itself (append_commit.hpp), so the
// attention queued behind it sees the new token; the host keeps the lengths as if every append were accepted and
// settles them once per step from the verdicts the commit kernel recorded (docs/cuda.md, "DeviceCache").
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "append_commit.hpp"
#include "check.hpp"
#include "device_cache_layer.hpp"
#include "encode_records.hpp"
#include "encode_params.hpp"
#include "kvcompact/cuda/tq_cache.hpp"

namespace kvcompact::cuda::tq {

Status DeviceCache::check_no_pending_appends(const char* operation) const {
  if (pending_.empty()) return ok_status();
  return make_error(ErrorCode::InvalidArgument,
                    "{} while {} deferred appends of a step are pending: call finish_appends first", operation,
                    pending_.size());
}

void DeviceCache::drop_pending_appends() {
  if (pending_.empty()) return;
  // The commit kernels zero the status words they read; waiting lets them finish before anything else runs.
  (void)cudaStreamSynchronize(static_cast<cudaStream_t>(pending_stream_));
  for (const PendingAppend& p : pending_) pending_slots_[std::size_t{p.layer} * sequences_ + p.seq] = false;
  pending_.clear();
  pending_stream_ = nullptr;
}

Status DeviceCache::append_deferred(std::uint32_t layer, std::span<const AppendRequest> requests, void* stream) {
  if (!pending_.empty() && stream != pending_stream_) {
    return make_error(ErrorCode::InvalidArgument,
                      "append_deferred on another stream than the pending step's: every call of a step uses one "
                      "stream (or finish_appends first)");
  }
  // (Not check_host_lengths as such: its pending-step check would refuse this step's own later calls.)
  if (lengths_on_device_) KVC_TRY(check_host_lengths("append_deferred"));
  KVC_TRY(check_append_requests(layer, requests, "append_deferred"));
  const std::size_t slots = layers_.size() * std::size_t{sequences_};
  for (const AppendRequest& r : requests) {
    if (r.rows > 0 && pending_slots_[std::size_t{layer} * sequences_ + r.seq]) {
      return make_error(ErrorCode::InvalidArgument,
                        "append_deferred: layer {} sequence {} already has an append in this step (finish_appends "
                        "first)",
                        layer, r.seq);
    }
  }
  if (std::none_of(requests.begin(), requests.end(), [](const AppendRequest& r) { return r.rows > 0; })) {
    return ok_status();
  }
  Layer& l = *layers_[layer];
  auto* status = static_cast<std::uint32_t*>(step_status_.data()) + std::size_t{layer} * sequences_;
  std::vector<EncodeRequest> encodes;
  std::vector<detail::CommitRequest> commits;
  for (const AppendRequest& r : requests) {
    if (r.rows == 0) continue;
    encodes.push_back(EncodeRequest{r.seq, r.position, r.rows, r.dtype, r.keys, r.values, status + r.seq});
    commits.push_back(detail::commit_request(encodes.back()));
  }
  const auto s = static_cast<cudaStream_t>(stream);
  // Each position is checked on the device against its length there: replays of a captured append_at_length
  // since the last sync_lengths move the device lengths without the host knowing, and this call has no wait in
  // which to read the commit counter (check_host_lengths). A stale request writes nothing (kEncodeStalePosition).
  // The ring rows wait for the commit kernel's verdicts (encode_records.hpp).
  const PositionCheck check{l.device_lengths()};
  Status launched = detail::encode_records_batch(l.layout, *l.codec, l.data.data(), encodes, nullptr, &check, stream);
  std::uint32_t commits_launched = 0;  // leading entries of `commits` whose launch succeeded
  if (launched.ok()) {
    detail::CommitTargets targets = l.commit_targets();
    targets.verdict_offset = static_cast<std::uint32_t>(slots);
    targets.slots = static_cast<std::uint32_t>(slots);
    const cudaError_t err = detail::launch_commit_appends(
        commits.data(), static_cast<std::uint32_t>(commits.size()), targets, s, &commits_launched);
    if (err != cudaSuccess) {
      launched = make_error(ErrorCode::Internal, "commit_appends launch: {}", cudaGetErrorString(err));
    }
  }
  if (!launched.ok()) {
    // A CUDA error: settle what earlier calls of the step left pending; of this call, the requests of the commit
    // launches before a failed one are committed on the device, which the host takes over (adopt_device_lengths),
    // and the others count as refused (nothing stored). The earlier calls' first rejection, which the caller's
    // finish_appends would have reported, goes into this error's message instead of being lost.
    (void)cudaStreamSynchronize(s);
    const Status earlier = finish_appends();
    std::string message = launched.error().message;
    if (commits_launched > 0) {
      message += fmt::format(" (this call's first {} of {} appends, in launches before the failed one, were "
                             "committed as their input allowed; the others were not)",
                             commits_launched, commits.size());
    }
    if (!earlier.ok()) {
      message += fmt::format(" (the step's earlier appends were settled: {})", earlier.error().to_string());
    }
    // The encodes that ran ORed their flags into this call's status words, and no commit zeroed those of the
    // launches that failed: cleared here, so that a later append of the same (layer, sequence) does not read
    // them as its own rejection.
    std::vector<std::uint32_t> launched_seqs;
    for (const AppendRequest& r : requests) {
      if (r.rows == 0) continue;
      (void)cudaMemsetAsync(status + r.seq, 0, sizeof(std::uint32_t), s);
      if (launched_seqs.size() < commits_launched) launched_seqs.push_back(r.seq);  // `commits`' order
    }
    adopt_device_lengths(layer, launched_seqs, stream);
    return make_error(ErrorCode::Internal, "{}", message);
  }
  pending_stream_ = stream;
  for (const AppendRequest& r : requests) {
    if (r.rows == 0) continue;
    pending_.push_back({layer, r.seq, r.position, l.lengths[r.seq]});
    pending_slots_[std::size_t{layer} * sequences_ + r.seq] = true;
    l.lengths[r.seq] = r.position + r.rows;  // as if accepted; finish_appends reverts a rejected one
  }
  return ok_status();
}

Status DeviceCache::finish_appends() {
  if (pending_.empty()) return ok_status();
  const std::size_t slots = layers_.size() * std::size_t{sequences_};
  std::vector<std::uint32_t> verdicts(slots);
  const auto s = static_cast<cudaStream_t>(pending_stream_);
  const auto* device_verdicts = static_cast<const std::uint32_t*>(step_status_.data()) + slots;
  const cudaError_t copy = cudaMemcpyAsync(verdicts.data(), device_verdicts, 4ull * slots, cudaMemcpyDeviceToHost, s);
  const cudaError_t wait = copy == cudaSuccess ? cudaStreamSynchronize(s) : copy;
  if (wait != cudaSuccess) {
    drop_pending_appends();
    return make_error(ErrorCode::Internal, "finish_appends: {} (the step's appends are in an unknown state)",
                      cudaGetErrorString(wait));
  }
  Status first_error = ok_status();
  for (const PendingAppend& p : pending_) {
    const std::uint32_t flags = verdicts[std::size_t{p.layer} * sequences_ + p.seq];
    if (flags == 0) continue;
    // The device kept the old length and wrote no ring row (append_commit.hpp): the host takes the old length
    // back. (A stale position wrote nothing; the host's lengths are then behind the device's, and the next call
    // that reads them refuses until sync_lengths.)
    layers_[p.layer]->lengths[p.seq] = p.old_length;
    if (first_error.ok()) first_error = rejected_append(p.layer, p.seq, p.position, flags);
  }
  for (const PendingAppend& p : pending_) pending_slots_[std::size_t{p.layer} * sequences_ + p.seq] = false;
  pending_.clear();
  pending_stream_ = nullptr;
  return first_error;
}

}  // namespace kvcompact::cuda::tq
