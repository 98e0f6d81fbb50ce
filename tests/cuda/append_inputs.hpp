// Random append inputs (and batches of sequences) for the DeviceCache and encode append tests:
// one request's rows on the host (for the CPU cache) and on the device (for the GPU cache), in one dtype.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "cuda/cuda_test_util.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
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

// One encode request of random rows for a batch in which request s appends to sequence s
// (tq_append_at_length_test.cpp, tq_position_check_test.cpp); `misaligned` moves its rows one element off a
// 16-byte boundary (the general kernel).
struct EncodeCase {
  std::uint32_t position = 0, rows = 0;
  DType dtype = DType::BF16;
  bool misaligned = false;
};
// The requests of `cases`, with status word status + s for request s, and the device rows they point at.
struct EncodeBatchInput {
  std::vector<AppendInput> inputs;
  std::vector<MisalignedRows> shifted;
  std::vector<tq::EncodeRequest> requests;
};
inline EncodeBatchInput make_encode_batch(std::mt19937_64& rng, std::span<const EncodeCase> cases, std::uint32_t heads,
                                          std::uint32_t d, std::uint32_t* status) {
  EncodeBatchInput batch;
  batch.inputs.reserve(cases.size());  // (requests point into the elements)
  batch.shifted.reserve(cases.size());
  for (std::uint32_t s = 0; s < cases.size(); ++s) {
    const EncodeCase& c = cases[s];
    const AppendInput& in = batch.inputs.emplace_back(make_append_input(rng, c.rows, heads, d, c.dtype));
    tq::EncodeRequest r{s, c.position, c.rows, c.dtype, in.device_keys.data(), in.device_values.data(), status + s};
    if (c.misaligned) {
      const MisalignedRows& m = batch.shifted.emplace_back(misaligned_copy(in, c.dtype));
      r.keys = m.key_ptr;
      r.values = m.value_ptr;
    }
    batch.requests.push_back(r);
  }
  return batch;
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
