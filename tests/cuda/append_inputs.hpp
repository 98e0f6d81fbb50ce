// Random append inputs (and batches of sequences) for the DeviceCache and encode append tests:
// one request's rows on the host (for the CPU cache) and on the device (for the GPU cache), in one dtype.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::testing {

struct AppendInput {
  std::vector<std::uint8_t> keys, values;  // host [rows, heads, d] of the dtype
  DeviceBuffer device_keys, device_values;
};

inline AppendInput make_append_input(std::mt19937_64& rng, std::uint32_t rows, std::uint32_t heads, std::uint32_t d,
                                     DType dtype) {
  using kvcompact::tq::testing::random_rows;
  AppendInput in;
  in.keys = to_dtype(random_rows(rng, std::size_t{rows} * heads, d, 1.0f, true), dtype);
  in.values = to_dtype(random_rows(rng, std::size_t{rows} * heads, d, 1.0f, false), dtype);
  in.device_keys = take(DeviceBuffer::allocate(std::max<std::size_t>(in.keys.size(), 4)));
  in.device_values = take(DeviceBuffer::allocate(std::max<std::size_t>(in.values.size(), 4)));
  EXPECT_TRUE(in.device_keys.upload(in.keys.data(), in.keys.size()).ok());
  EXPECT_TRUE(in.device_values.upload(in.values.data(), in.values.size()).ok());
  return in;
}

// A copy of device rows at an address 16-byte misaligned (by one element), so the encode takes its general
// kernel (tq_append_at_length_test.cpp, tq_position_check_test.cpp: that kernel reads the device lengths too).
struct MisalignedRows {
  DeviceBuffer keys, values;
  const void* key_ptr = nullptr;
  const void* value_ptr = nullptr;
};
inline MisalignedRows misaligned_copy(const AppendInput& in, DType dtype) {
  const std::size_t shift = dtype_bits(dtype) / 8;
  MisalignedRows m;
  m.keys = take(DeviceBuffer::allocate(in.keys.size() + 16));
  m.values = take(DeviceBuffer::allocate(in.values.size() + 16));
  m.key_ptr = static_cast<std::uint8_t*>(m.keys.data()) + shift;
  m.value_ptr = static_cast<std::uint8_t*>(m.values.data()) + shift;
  EXPECT_EQ(cudaMemcpy(const_cast<void*>(m.key_ptr), in.keys.data(), in.keys.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  EXPECT_EQ(cudaMemcpy(const_cast<void*>(m.value_ptr), in.values.data(), in.values.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  return m;
}

// A random non-empty subset of the sequences [0, sequences) in random order: the requests of one batched append.
inline std::vector<std::uint32_t> random_sequence_subset(std::mt19937_64& rng, std::uint32_t sequences) {
  std::vector<std::uint32_t> seqs(sequences);
  std::iota(seqs.begin(), seqs.end(), 0u);
  std::shuffle(seqs.begin(), seqs.end(), rng);
  seqs.resize(1 + rng() % sequences);
  return seqs;
}

}  // namespace kvcompact::cuda::testing
