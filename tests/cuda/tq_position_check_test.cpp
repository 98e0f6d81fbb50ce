// encode_append_batch with a PositionCheck (DeviceCache::append_deferred's encode): each request appends at its
// host position only where that position is the device's length when the kernel runs; a stale one writes
// nothing — no record, no window-ring slot — and reports kEncodeStalePosition. Checked for the fast kernel and
// the general one, in a batch and alone (one request runs the batched instance). Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda/append_inputs.hpp"
#include "cuda/cuda_test_util.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/layout.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::EncodeBatchInput;
using kvcompact::cuda::testing::EncodeCase;
using kvcompact::cuda::testing::make_encode_batch;
using kvcompact::cuda::testing::take;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::testing::fresh_seed;

std::vector<std::uint8_t> layer_bytes(const DeviceBuffer& layer) {
  std::vector<std::uint8_t> bytes(layer.size());
  EXPECT_OK(layer.download(bytes.data(), bytes.size()));
  return bytes;
}

TEST(CudaPositionCheck, StalePositionsWriteNothing) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // An exact window, so that a stale request's ring slots are checked too.
  const QuantConfig config = *QuantConfig::parse("k=mse4,v=mse3,nc,w=8", seed);
  const std::uint32_t d = 128, heads = 2, sequences = 4, capacity = 48;
  auto codec = take(kvcompact::tq::LayerCodec::create(d, config, 5));
  auto dcodec = take(DeviceCodec::create(codec));
  const auto layout = take(kvcompact::tq::plan_layer_layout(d, heads, sequences, capacity, config));
  auto checked = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  auto reference = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  ASSERT_OK(checked.fill(0));
  ASSERT_OK(reference.fill(0));
  // Each request's host position, and the device lengths: sequence 0 fast and current, 1 general (misaligned
  // rows) and current, 2 general and stale (the device is 3 tokens ahead), 3 fast and stale.
  const EncodeCase cases[sequences] = {
      {5, 3, DType::BF16, false}, {0, 20, DType::F32, true}, {27, 4, DType::F16, true}, {9, 9, DType::BF16, false}};
  const std::uint32_t device_length[sequences] = {5, 0, 30, 12};
  auto lengths = take(DeviceBuffer::allocate(sizeof(device_length)));
  ASSERT_OK(lengths.upload(device_length, sizeof(device_length)));
  auto status = take(DeviceBuffer::allocate(4 * sequences));
  ASSERT_OK(status.fill(0));
  const EncodeBatchInput batch = make_encode_batch(rng, cases, heads, d, static_cast<std::uint32_t*>(status.data()));
  const std::vector<EncodeRequest>& requests = batch.requests;
  for (std::uint32_t s = 0; s < sequences; ++s) {
    if (cases[s].position == device_length[s]) {  // the reference: only the current requests, unchecked
      EncodeRequest r = requests[s];
      r.status = nullptr;
      ASSERT_OK(encode_append(layout, dcodec, reference.data(), r));
    }
  }
  const PositionCheck check{static_cast<const std::uint32_t*>(lengths.data())};
  ASSERT_OK(encode_append_batch(layout, dcodec, checked.data(), requests, check));
  ASSERT_OK(synchronize());
  EXPECT_TRUE(layer_bytes(checked) == layer_bytes(reference))
      << "the layer bytes differ from the current requests' appends alone";
  std::uint32_t flags[sequences], after[sequences];
  ASSERT_OK(status.download(flags, sizeof(flags)));
  ASSERT_OK(lengths.download(after, sizeof(after)));
  for (std::uint32_t s = 0; s < sequences; ++s) {
    EXPECT_EQ(flags[s], cases[s].position == device_length[s] ? 0u : kEncodeStalePosition) << "sequence " << s;
    EXPECT_EQ(after[s], device_length[s]) << "the encode reads the lengths and leaves them";
  }

  // One stale request alone (the fast kernel's batched instance with a count of one) writes nothing either.
  ASSERT_OK(status.fill(0));
  const std::vector<std::uint8_t> before = layer_bytes(checked);
  ASSERT_OK(encode_append_batch(layout, dcodec, checked.data(), {&requests[3], 1}, check));
  ASSERT_OK(synchronize());
  EXPECT_TRUE(layer_bytes(checked) == before) << "a lone stale request wrote bytes";
  ASSERT_OK(status.download(flags, sizeof(flags)));
  EXPECT_EQ(flags[3], kEncodeStalePosition);

  // Host checks: the lengths array is required; the capacity check of the position is append's.
  EXPECT_EQ(encode_append_batch(layout, dcodec, checked.data(), requests, PositionCheck{}).error().code,
            ErrorCode::InvalidArgument);
  EncodeRequest too_far = requests[0];
  too_far.position = capacity - 1;
  EXPECT_EQ(encode_append_batch(layout, dcodec, checked.data(), {&too_far, 1}, check).error().code,
            ErrorCode::CapacityExceeded);
}

}  // namespace
}  // namespace kvcompact::cuda::tq
