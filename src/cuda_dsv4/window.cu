// Window write kernel of the DeepSeek-V4 cache: one block of 512 threads per (sequence, token), thread j owns
// dim j. It rounds the token's row c_t as the model does (fp_sim.hpp simulate_main_row) and encodes it with the
// cache's attention storage into ring slot q % capacity; only the last `capacity` tokens of a span are written
// (earlier ones would be overwritten within the same span), every token's row goes to the optional chunk_rows,
// and every token's input is checked for NaN / inf.
#include <cuda_runtime.h>

#include "cache_params.hpp"
#include "compressor_device.cuh"

namespace kvcompact::cuda::dsv4::detail {

namespace {

__global__ void __launch_bounds__(512) window_write_kernel(const WindowParams p) {
  __shared__ float scratch[16];
  if (blockIdx.x >= p.n_items) return;
  const WindowItem& item = p.items[blockIdx.x];
  const unsigned j = threadIdx.x;
  const std::uint64_t end = item.start + item.count;
  const std::uint64_t first_written = end > p.capacity && end - p.capacity > item.start ? end - p.capacity : item.start;
  for (std::uint64_t k = blockIdx.y; k < item.count; k += gridDim.y) {
    float x = item.kv[k * kWidth + j];
    if (p.check_finite != 0 && !isfinite(x)) atomicOr(item.status, kFlagNonFinite);
    const std::uint64_t q = item.start + k;
    const bool to_ring = q >= first_written;
    if (!to_ring && item.chunk_rows == nullptr) continue;  // uniform over the block
    x = fp8_sim_main(x, j, scratch);
    if (to_ring) encode_attention_row(item.window + (q % p.capacity) * p.row_bytes, x, j, p.storage, scratch);
    if (item.chunk_rows != nullptr) encode_attention_row(item.chunk_rows + k * p.row_bytes, x, j, p.storage, scratch);
  }
}

}  // namespace

cudaError_t launch_window_write(const WindowParams& p, std::uint64_t max_count, cudaStream_t stream) {
  if (p.n_items == 0 || max_count == 0) return cudaSuccess;
  const unsigned gy = static_cast<unsigned>(max_count < kMaxGridY ? max_count : kMaxGridY);
  window_write_kernel<<<dim3(p.n_items, gy), kWidth, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kvcompact::cuda::dsv4::detail
