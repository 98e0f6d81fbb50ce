// Random packed layer contents for the CUDA benchmark (kernel in fill.cu): random code and sign bytes, key
// and value norms in [0.5, 2), residual norms in [0, 1) as f16. No fmt / kvcompact error headers here, so
// nvcc compiles the kernel side alone.
#pragma once

#include <cstdint>

namespace kvcompact::bench {

struct FillRegions {
  std::uint64_t bytes_offset[4];  // key codes, key signs, value codes, (unused) — random bytes
  std::uint64_t bytes_count[4];
  std::uint64_t f32_offset[2];    // key norms, value norms
  std::uint64_t f32_count[2];
  std::uint64_t f16_offset;       // residual norms
  std::uint64_t f16_count;
};

// Returns a cudaError_t as int (0 = success).
int fill_layer_random(void* layer, const FillRegions& regions, std::uint64_t seed);
// Fills `count` bf16 values with N(0, 1)-ish random numbers.
int fill_bf16_random(void* data, std::uint64_t count, std::uint64_t seed);
// Flips the sign of a random half of the nonzero values of `count` DeepSeek-V4 indexer rows in place (the values
// are symmetric codes, so every row stays on its grid and keeps its scale): rows replicated from a small pool
// become distinct, and so do their scores. `format` 0 = BF16 rows (128 x 2 bytes), 1 = FP8 (128 e4m3 codes, then
// the scale), 2 = MXFP4 (64 bytes of e2m1 nibbles, then the scales); `row_bytes` is the row's size.
int flip_indexer_signs(void* rows, std::uint64_t count, int format, std::uint64_t row_bytes, std::uint64_t seed);

}  // namespace kvcompact::bench
