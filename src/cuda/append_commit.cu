// The commit kernel of DeviceCache's appends (append_commit.hpp): per request, the accepted rows' exact-window
// ring slots, then the length, the verdict and the status word. A request runs on gridDim.y blocks (a long
// append's ring rows are spread over them); they count themselves in the status word's upper half, and the last
// one to arrive does the request's bookkeeping, after every block has read the verdict (a launch of one block per
// request counts nothing).
#include <algorithm>
#include <atomic>

#include "append_commit.hpp"
#include "input_widen.cuh"
#include "pdl.cuh"

namespace kvcompact::cuda::tq::detail {

namespace {

constexpr unsigned kCommitThreads = 256;
// Coordinates a thread loads before it stores them (independent loads: one round trip for a decode step's row).
constexpr unsigned kPerThread = 4;
// At most this many blocks per request: a prefill-sized append's W ring rows, a few rows per block.
constexpr std::uint32_t kMaxRingBlocks = 64;
// The status word's lower half holds the encode's kStatus* bits, the upper half counts the commit's blocks.
constexpr std::uint32_t kArrival = 1u << 16;
constexpr std::uint32_t kVerdictBits = kArrival - 1;
static_assert(kMaxRingBlocks < (1u << 16), "a request's block arrivals must fit the status word's upper half");

struct CommitBatch {
  std::uint32_t count;  // 1 .. kEncodeBatchMax
  CommitRequest request[kEncodeBatchMax];
};

// This block's share of the request's last min(rows, W) rows (rows y, y + gridDim.y, ... of them), widened to
// f32, to ring slots (position + row) mod W. Earlier rows of the append would land on the same slots: skipped.
__device__ void write_ring_rows(const CommitRing& ring, const CommitRequest& r, std::uint32_t position) {
  const std::uint32_t d = ring.head_dim, heads = ring.kv_heads, w = ring.window;
  const std::uint32_t first = r.rows > w ? r.rows - w : 0;
  const std::uint32_t row_elements = heads * d;
  float* const keys = reinterpret_cast<float*>(ring.layer + ring.keys_offset);
  float* const values = reinterpret_cast<float*>(ring.layer + ring.values_offset);
  for (std::uint32_t i = first + blockIdx.y; i < r.rows; i += gridDim.y) {
    const std::uint64_t source_row = static_cast<std::uint64_t>(i) * row_elements;
    const std::uint32_t slot = (position + i) % w;
    for (std::uint32_t e0 = threadIdx.x; e0 < row_elements; e0 += kPerThread * kCommitThreads) {
      float k[kPerThread], v[kPerThread];
#pragma unroll
      for (unsigned u = 0; u < kPerThread; ++u) {
        const std::uint32_t e = e0 + u * kCommitThreads;
        if (e < row_elements) {
          k[u] = load_input(r.keys, source_row + e, r.dtype);
          v[u] = load_input(r.values, source_row + e, r.dtype);
        }
      }
#pragma unroll
      for (unsigned u = 0; u < kPerThread; ++u) {
        const std::uint32_t e = e0 + u * kCommitThreads;
        if (e < row_elements) {
          const std::uint32_t head = e / d;
          const std::uint64_t at = ((static_cast<std::uint64_t>(r.seq) * heads + head) * w + slot) * d + (e - head * d);
          keys[at] = k[u];
          values[at] = v[u];
        }
      }
    }
  }
}

__global__ void __launch_bounds__(kCommitThreads)
    commit_appends_kernel(const __grid_constant__ CommitBatch batch, const CommitTargets t) {
  kvcompact::cuda::detail::wait_for_previous_grid();  // (launch_after_previous: the encode before it)
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && t.commits != nullptr) atomicAdd(t.commits, 1u);
  const CommitRequest& r = batch.request[blockIdx.x];
  if (r.rows == 0) return;
  __shared__ std::uint32_t shared_verdict, shared_length, shared_last;
  if (threadIdx.x == 0) {
    // The length before this request's commit: read before this block arrives, so before the last block
    // (which has seen every arrival) updates it. A request on one block (no ring rows, or one) has nothing to
    // count and skips the fences and the atomic: a host-synchronised append waits for their latency (with them,
    // the step benchmark's per-sequence appends ran 4-6 % slower on the H100 of 2026-12-05).
    const std::uint32_t length = t.lengths[r.seq];
    std::uint32_t seen;  // the encode before it on the stream has finished
    if (gridDim.y == 1) {
      seen = *r.status;
    } else {
      __threadfence();
      seen = atomicAdd(r.status, kArrival);
    }
    shared_verdict = seen & kVerdictBits;
    shared_length = length;
    shared_last = (seen >> 16) == gridDim.y - 1 ? 1u : 0u;
  }
  __syncthreads();
  const std::uint32_t verdict = shared_verdict, length = shared_length;
  const std::uint32_t position = t.at_length ? length : r.position;
  if (verdict == 0 && t.ring.window > 0) write_ring_rows(t.ring, r, position);
  if (threadIdx.x != 0 || shared_last == 0) return;
  if (gridDim.y > 1) __threadfence();  // (after the arrivals this block has seen)
  *r.status = 0;
  if (t.verdict_offset != 0) r.status[t.verdict_offset] = verdict;
  if (verdict == 0) {
    t.lengths[r.seq] = position + r.rows;
    return;
  }
  if (t.sticky) {
    std::uint32_t* flags = r.status + 2 * t.slots;
    if (*flags == 0) flags[t.slots] = length;  // the first rejection's position
    *flags |= verdict;
  }
}

// The test hook's count (fail_commit_launch_for_testing); negative: disarmed.
std::atomic<int> launches_before_injected_failure{-1};

// Whether the test hook (fail_commit_launch_for_testing) makes this launch fail; counts it down otherwise.
bool injected_launch_failure() {
  int left = launches_before_injected_failure.load();
  while (left >= 0) {
    if (launches_before_injected_failure.compare_exchange_weak(left, left - 1)) return left == 0;
  }
  return false;
}

}  // namespace

void fail_commit_launch_for_testing(int launches_before_failure) {
  launches_before_injected_failure.store(std::max(launches_before_failure, -1));
}

cudaError_t launch_commit_appends(const CommitRequest* requests, std::uint32_t count, const CommitTargets& targets,
                                  cudaStream_t stream, std::uint32_t* requests_launched) {
  if (requests_launched != nullptr) *requests_launched = 0;
  for (std::uint32_t first = 0; first < count; first += kEncodeBatchMax) {
    CommitBatch batch{};
    batch.count = std::min(count - first, kEncodeBatchMax);
    std::uint32_t ring_rows = 0;  // the most ring rows one request of the launch writes
    for (std::uint32_t i = 0; i < batch.count; ++i) {
      batch.request[i] = requests[first + i];
      ring_rows = std::max(ring_rows, std::min(batch.request[i].rows, targets.ring.window));
    }
    const dim3 grid(batch.count, std::clamp(ring_rows, 1u, kMaxRingBlocks));
    if (injected_launch_failure()) return cudaErrorLaunchOutOfResources;
    cudaError_t err = kvcompact::cuda::detail::launch_after_previous(commit_appends_kernel, grid, dim3(kCommitThreads),
                                                                     0, stream, batch, targets);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    if (requests_launched != nullptr) *requests_launched = first + batch.count;
  }
  return cudaSuccess;
}

}  // namespace kvcompact::cuda::tq::detail
