// The commit kernel of DeviceCache's appends without a host wait (append_commit.hpp): one thread per request.
#include "append_commit.hpp"
#include "pdl.cuh"

namespace kvcompact::cuda::tq::detail {

namespace {

// The verdict bits that mean the encode may have written ring slots (every one but those of requests that
// wrote nothing: beyond the length limit, or a stale position).
constexpr std::uint32_t kWroteRejected = ~(kStatusBeyondLimit | kStatusStalePosition);

__global__ void commit_appends_kernel(const __grid_constant__ EncodeBatch batch, const CommitTargets t) {
  kvcompact::cuda::detail::wait_for_previous_grid();  // (launch_after_previous: the encode before it)
  if (threadIdx.x == 0 && t.commits != nullptr) atomicAdd(t.commits, 1u);
  if (threadIdx.x >= batch.count) return;
  const EncodeSegment& r = batch.segment[threadIdx.x];
  if (r.rows == 0) return;
  const std::uint32_t verdict = *r.status;  // the encode before it on the stream has finished
  *r.status = 0;
  if (t.verdict_offset != 0) r.status[t.verdict_offset] = verdict;
  const std::uint32_t length = t.lengths[r.seq];
  if (verdict == 0) {
    t.lengths[r.seq] = (t.at_length ? length : r.position) + r.rows;
    return;
  }
  if (t.sticky) {
    std::uint32_t* flags = r.status + 2 * t.slots;
    if (*flags == 0) flags[t.slots] = length;  // the first rejection's position
    *flags |= verdict;
  }
  if (t.window_begins != nullptr && (verdict & kWroteRejected) != 0) t.window_begins[r.seq] = length;
}

}  // namespace

cudaError_t launch_commit_appends(const EncodeSegment* requests, std::uint32_t count, const CommitTargets& targets,
                                  cudaStream_t stream) {
  for (std::uint32_t first = 0; first < count; first += kEncodeBatchMax) {
    EncodeBatch batch{};
    batch.count = count - first < kEncodeBatchMax ? count - first : kEncodeBatchMax;
    for (std::uint32_t i = 0; i < batch.count; ++i) batch.segment[i] = requests[first + i];
    cudaError_t err = kvcompact::cuda::detail::launch_after_previous(commit_appends_kernel, dim3(1),
                                                                     dim3(kEncodeBatchMax), 0, stream, batch, targets);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace kvcompact::cuda::tq::detail
