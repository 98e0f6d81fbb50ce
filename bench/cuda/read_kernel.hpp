// The streaming-read kernel of the read-ceiling benchmark (read_ceiling_bench.cpp; kernel in read_kernel.cu):
// every byte of a buffer loaded once in 16-byte words, nothing written but a never-taken flag, so its time is
// what one launch needs to read those bytes. No fmt / kvcompact error headers here, so nvcc compiles it alone.
#pragma once

#include <cstdint>

namespace kvcompact::bench {

// A launch shape of the read kernel: threads per block, blocks per multiprocessor, 16-byte loads in flight per
// thread.
struct ReadShape {
  unsigned threads = 256;
  unsigned blocks_per_sm = 4;
  unsigned in_flight = 8;  // 4 or 8
};

// Reads `bytes` (a multiple of 16; 16-byte aligned) at `data` on `stream` with `multiprocessors` × blocks_per_sm
// blocks; `flag` (4 device bytes) is written only if the words' XOR has a value no filled buffer gives. Returns
// a cudaError_t as int (0 = success; an in_flight other than 4 or 8 is cudaErrorInvalidValue).
int launch_read(const void* data, std::uint64_t bytes, unsigned* flag, const ReadShape& shape, int multiprocessors,
                void* stream);

}  // namespace kvcompact::bench
