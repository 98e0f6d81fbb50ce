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

}  // namespace kvcompact::bench
