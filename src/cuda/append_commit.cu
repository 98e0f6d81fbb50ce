// The commit kernel of DeviceCache's deferred appends (append_commit.hpp): one thread per request.
#include "append_commit.hpp"

namespace kvcompact::cuda::tq::detail {

namespace {

__global__ void commit_appends_kernel(const __grid_constant__ EncodeBatch batch, std::uint32_t* lengths,
                                      std::uint32_t* window_begins, std::uint32_t verdict_offset) {
  if (threadIdx.x >= batch.count) return;
  const EncodeSegment& r = batch.segment[threadIdx.x];
  if (r.rows == 0) return;
  const std::uint32_t verdict = *r.status;  // the encode before it on the stream has finished
  *r.status = 0;
  r.status[verdict_offset] = verdict;
  if (verdict == 0) {
    lengths[r.seq] = r.position + r.rows;
  } else if (window_begins != nullptr) {
    window_begins[r.seq] = lengths[r.seq];
  }
}

}  // namespace

cudaError_t launch_commit_appends(const EncodeSegment* requests, std::uint32_t count, std::uint32_t* lengths,
                                  std::uint32_t* window_begins, std::uint32_t verdict_offset, cudaStream_t stream) {
  for (std::uint32_t first = 0; first < count; first += kEncodeBatchMax) {
    EncodeBatch batch{};
    batch.count = count - first < kEncodeBatchMax ? count - first : kEncodeBatchMax;
    for (std::uint32_t i = 0; i < batch.count; ++i) batch.segment[i] = requests[first + i];
    commit_appends_kernel<<<1, kEncodeBatchMax, 0, stream>>>(batch, lengths, window_begins, verdict_offset);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace kvcompact::cuda::tq::detail
