// Internal: the plain parameter structs of the DeepSeek-V4 cache kernels (window write, compressors) and
// their launchers. Included by the kernels (.cu, no fmt / error header) and by the host launchers
// (window.cpp, compressor.cpp), which validate arguments, build these structs and map CUDA errors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvcompact::cuda::dsv4::detail {

// Sequences per launch (the params travel by value: 32 items keep them under 4 KiB); longer batches are
// launched in pieces.
inline constexpr unsigned kMaxItemsPerLaunch = 32;
inline constexpr unsigned kMaxGridY = 65535;

// Bits OR-ed into a cache's status word by the kernels.
inline constexpr std::uint32_t kFlagNonFinite = 1u;

// Storage codes (the values of dsv4::RowStorage / dsv4::IndexerStorage).
inline constexpr std::uint32_t kRowBf16 = 0, kRowFp8 = 1;
inline constexpr std::uint32_t kIndexerBf16 = 0, kIndexerFp8 = 1, kIndexerMxfp4 = 2;

struct WindowItem {
  std::uint8_t* window;   // the layer's ring: [capacity, row_bytes]
  const float* kv;        // [count, 512]
  std::uint8_t* chunk_rows;  // optional [count, row_bytes]: every token's encoded row
  std::uint32_t* status;  // the cache's status word
  std::uint64_t start;    // position of the span's first token
  std::uint64_t count;
};

struct WindowParams {
  WindowItem items[kMaxItemsPerLaunch];
  std::uint32_t n_items;
  std::uint32_t storage;    // kRowBf16 / kRowFp8
  std::uint64_t row_bytes;  // 1024 / 584
  std::uint64_t capacity;   // window_capacity (ring rows)
  std::uint32_t check_finite;
};

// grid (n_items, min(max count, kMaxGridY)), 512 threads: one block per (sequence, token).
cudaError_t launch_window_write(const WindowParams& p, std::uint64_t max_count, cudaStream_t stream);

struct CompressorItem {
  float* kv_state;        // [coff*m, coff*width]
  float* score_state;
  std::uint8_t* rows;     // compressed rows (main) or indexer rows: row g at g * row_bytes
  const float* a;         // [count, coff*width]
  const float* z;         // [count, coff*width]
  std::uint32_t* status;
  std::uint64_t start;
  std::uint64_t count;
};

struct CompressorParams {
  CompressorItem items[kMaxItemsPerLaunch];
  std::uint32_t n_items;
  std::uint32_t ratio;      // m
  std::uint32_t coff;       // 2 for m = 4, else 1
  std::uint32_t storage;    // main: kRow*; indexer: kIndexer*
  std::uint64_t row_bytes;
  const float* ape;         // [m, coff*width]
  const float* norm;        // [width]
  float inv_freq[32];       // the compressed layers' RoPE table (rope.hpp)
  float norm_eps;
  float hadamard_scale;     // float32(1 / sqrt(128)), indexer branch
  std::uint32_t check_finite;
};

// How to run a batch: sequentially (one block per item walks its tokens: decode) or in parallel (a block per
// emitted group reads the inputs, then a state pass: prefill chunks); both give the same bits.
struct CompressorLaunch {
  bool parallel = false;
  std::uint64_t max_count = 0;    // the batch's largest span
  std::uint64_t max_emitted = 0;  // the batch's most rows emitted by one span
};

// Main branch (width 512, 512 threads) or indexer branch (width 128, 128 threads).
cudaError_t launch_compressor_main(const CompressorParams& p, const CompressorLaunch& how, cudaStream_t stream);
cudaError_t launch_compressor_indexer(const CompressorParams& p, const CompressorLaunch& how, cudaStream_t stream);

}  // namespace kvcompact::cuda::dsv4::detail
