// DeviceCache::append_at_length / sync_lengths (appends at the device-resident lengths, so a captured CUDA graph
// of a decode step can be replayed) and the codec-level encode_append_batch at the device lengths: random steps — direct calls and graph replays — must leave the bytes and
// lengths of a CPU TurboQuantCache appending one by one, decode in the same step must see the new tokens,
// refusals (bad input, rows beyond max_length) are kept on the device until sync_lengths, and the rules of
// device-held lengths are typed errors. Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/append_inputs.hpp"
#include "cuda/cuda_test_util.hpp"
#include "cuda/device_cache_checks.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/layout.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::AppendInput;
using kvcompact::cuda::testing::expect_decode_matches_oracle;
using kvcompact::cuda::testing::expect_decode_output_matches_oracle;
using kvcompact::cuda::testing::expect_layers_match;
using kvcompact::cuda::testing::expect_same_snapshot;
using kvcompact::cuda::testing::make_append_input;
using kvcompact::cuda::testing::EncodeBatchInput;
using kvcompact::cuda::testing::EncodeCase;
using kvcompact::cuda::testing::make_encode_batch;
using kvcompact::cuda::testing::misaligned_copy;
using kvcompact::cuda::testing::MisalignedRows;
using kvcompact::cuda::testing::take;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;

// The codec-level form (encode_append_batch with DeviceLengths): the bytes equal encode_append at the host
// positions, for the fast kernel and the general one; requests ending beyond the limit write nothing and report
// kEncodeBeyondLimit; the device lengths are read, not advanced.
TEST(CudaAppendAtLength, EncodeAtDeviceLengthsEqualsHostPositions) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=prod3,v=mse3,w=8", seed);
  const std::uint32_t d = 128, heads = 2, sequences = 4, capacity = 40, limit = 36;
  auto codec = take(kvcompact::tq::LayerCodec::create(d, config, 3));
  auto dcodec = take(DeviceCodec::create(codec));
  const auto layout = take(kvcompact::tq::plan_layer_layout(d, heads, sequences, capacity, config));
  auto at_lengths = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  auto at_positions = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  ASSERT_TRUE(at_lengths.fill(0).ok());
  ASSERT_TRUE(at_positions.fill(0).ok());
  // Sequence 0: 3 bf16 rows at 5 (fast); 1: 20 f32 rows at 0, misaligned (general); 2: 12 f16 rows at 30
  // (general, 42 > 36: refused); 3: 9 bf16 rows at 30 (fast, 39 > 36: refused). The positions are the device
  // lengths (the requests' own are not read).
  const EncodeCase cases[sequences] = {
      {5, 3, DType::BF16, false}, {0, 20, DType::F32, true}, {30, 12, DType::F16, true}, {30, 9, DType::BF16, false}};
  std::uint32_t lengths[sequences];
  for (std::uint32_t s = 0; s < sequences; ++s) lengths[s] = cases[s].position;
  auto device_lengths = take(DeviceBuffer::allocate(sizeof(lengths)));
  ASSERT_TRUE(device_lengths.upload(lengths, sizeof(lengths)).ok());
  auto status = take(DeviceBuffer::allocate(4 * sequences));
  ASSERT_TRUE(status.fill(0).ok());
  const EncodeBatchInput batch = make_encode_batch(rng, cases, heads, d, static_cast<std::uint32_t*>(status.data()));
  const std::vector<EncodeRequest>& requests = batch.requests;
  for (std::uint32_t s = 0; s < sequences; ++s) {
    if (lengths[s] + cases[s].rows <= limit) {  // the reference: the same rows at the host position
      EncodeRequest r = requests[s];
      r.status = nullptr;
      ASSERT_TRUE(encode_append(layout, dcodec, at_positions.data(), r).ok());
    }
  }
  const DeviceLengths at{static_cast<const std::uint32_t*>(device_lengths.data()), limit};
  const Status st = encode_append_batch(layout, dcodec, at_lengths.data(), requests, at);
  ASSERT_TRUE(st.ok()) << st.error().to_string();
  ASSERT_TRUE(synchronize().ok());
  std::vector<std::uint8_t> a(layer_buffer_bytes(layout)), b(a.size());
  ASSERT_TRUE(at_lengths.download(a.data(), a.size()).ok());
  ASSERT_TRUE(at_positions.download(b.data(), b.size()).ok());
  EXPECT_TRUE(a == b) << "the layer bytes differ from the appends at the host positions";
  std::uint32_t flags[sequences], after[sequences];
  ASSERT_TRUE(status.download(flags, sizeof(flags)).ok());
  ASSERT_TRUE(device_lengths.download(after, sizeof(after)).ok());
  for (std::uint32_t s = 0; s < sequences; ++s) {
    EXPECT_EQ(flags[s], lengths[s] + cases[s].rows <= limit ? 0u : kEncodeBeyondLimit) << "sequence " << s;
    EXPECT_EQ(after[s], lengths[s]) << "the encode reads the lengths and leaves them";
  }
  // Host checks: rows beyond the limit, a limit beyond the capacity, no lengths array.
  EncodeRequest too_long = requests[0];
  too_long.rows = limit + 1;
  EXPECT_EQ(encode_append_batch(layout, dcodec, at_lengths.data(), {&too_long, 1}, at).error().code,
            ErrorCode::CapacityExceeded);
  EXPECT_EQ(encode_append_batch(layout, dcodec, at_lengths.data(), requests, DeviceLengths{at.lengths, capacity + 1})
                .error()
                .code,
            ErrorCode::CapacityExceeded);
  EXPECT_EQ(encode_append_batch(layout, dcodec, at_lengths.data(), requests, DeviceLengths{nullptr, limit}).error().code,
            ErrorCode::InvalidArgument);
}

TEST(CudaAppendAtLength, StepsMatchTheCpuCacheAcrossSyncs) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  for (const char* mode : {"k=mse4,v=mse3,nc,w=8", "k=prod3,v=mse2"}) {
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string("mode ") + mode + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    // Layer 1 has no attention (0 KV heads) in between.
    const CacheShape shape{.head_dim = 128, .kv_heads = {2, 0, 4}, .sequences = 5, .capacity = 96};
    auto cpu = take(TurboQuantCache::create(shape, config));
    auto gpu = take(DeviceCache::create(shape, config));
    const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
    std::vector<std::uint32_t> synced(3 * shape.sequences, 0);  // the lengths at the last sync
    for (int step = 0; step < 8; ++step) {
      std::vector<AppendInput> inputs;
      std::vector<MisalignedRows> misaligned;
      inputs.reserve(2 * shape.sequences);
      misaligned.reserve(2 * shape.sequences);
      for (std::uint32_t layer : {0u, 2u}) {
        const std::uint32_t heads = shape.kv_heads[layer];
        std::vector<LengthAppend> requests;
        for (std::uint32_t s : kvcompact::cuda::testing::random_sequence_subset(rng, shape.sequences)) {
          // Single rows (a decode step) and, in the first step, a prompt of up to 20 rows; sometimes 0 rows.
          const std::uint32_t rows = step == 0 ? static_cast<std::uint32_t>(rng() % 21) : (rng() % 6 == 0 ? 0u : 1u);
          const DType dtype = dtypes[rng() % 3];
          inputs.push_back(make_append_input(rng, rows, heads, shape.head_dim, dtype));
          const AppendInput& in = inputs.back();
          ASSERT_TRUE(cpu.append(layer, s, cpu.length(layer, s), rows, dtype, in.keys.data(), in.values.data()).ok());
          LengthAppend r{s, rows, dtype, in.device_keys.data(), in.device_values.data()};
          if (rows > 0 && rng() % 4 == 0) {  // some requests through the general kernel
            misaligned.push_back(misaligned_copy(in, dtype));
            r.keys = misaligned.back().key_ptr;
            r.values = misaligned.back().value_ptr;
          }
          requests.push_back(r);
        }
        const Status st = gpu.append_at_length(layer, requests, shape.capacity);
        ASSERT_TRUE(st.ok()) << st.error().to_string();
        // Queued behind the appends on the same stream: decode attends over the device lengths.
        expect_decode_matches_oracle(cpu, gpu, layer, 2 * heads, rng);
      }
      for (std::uint32_t layer : {0u, 2u}) {
        for (std::uint32_t s = 0; s < shape.sequences; ++s) {
          EXPECT_EQ(gpu.length(layer, s), synced[layer * shape.sequences + s]) << "the host keeps the last sync's";
        }
      }
      if (step % 3 == 1) continue;  // some syncs cover two or three steps
      const Status synced_status = gpu.sync_lengths();
      ASSERT_TRUE(synced_status.ok()) << synced_status.error().to_string();
      EXPECT_FALSE(gpu.lengths_on_device());
      for (std::uint32_t layer : {0u, 2u}) {
        for (std::uint32_t s = 0; s < shape.sequences; ++s) synced[layer * shape.sequences + s] = cpu.length(layer, s);
      }
      expect_layers_match(cpu, gpu, {0u, 2u}, "step " + std::to_string(step));
    }
  }
}

TEST(CudaAppendAtLength, GraphReplaysOfAStepMatchTheCpuCache) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=mse4,v=mse3,nc,w=8", seed);
  const CacheShape shape{.head_dim = 128, .kv_heads = {2, 4}, .sequences = 3, .capacity = 64};
  const std::uint32_t d = shape.head_dim, layers = 2;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  // Prompts of different lengths (one empty) through the ordinary append.
  const std::uint32_t prompt[] = {5, 0, 17};
  for (std::uint32_t layer = 0; layer < layers; ++layer) {
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const AppendInput in = make_append_input(rng, prompt[s], shape.kv_heads[layer], d, DType::BF16);
      ASSERT_TRUE(cpu.append(layer, s, 0, prompt[s], DType::BF16, in.keys.data(), in.values.data()).ok());
      ASSERT_TRUE(gpu.append(layer, s, 0, prompt[s], DType::BF16, in.device_keys.data(), in.device_values.data()).ok());
    }
  }
  // The step's static buffers: per layer one bf16 token row per sequence, queries and outputs.
  std::vector<DeviceBuffer> token_k, token_v, queries, outputs, workspaces;
  std::vector<DecodePlan> plans;
  for (std::uint32_t layer = 0; layer < layers; ++layer) {
    const std::size_t row_bytes = std::size_t{shape.kv_heads[layer]} * d * 2;
    const std::size_t q_floats = std::size_t{shape.sequences} * 2 * shape.kv_heads[layer] * d;
    token_k.push_back(take(DeviceBuffer::allocate(shape.sequences * row_bytes)));
    token_v.push_back(take(DeviceBuffer::allocate(shape.sequences * row_bytes)));
    queries.push_back(take(DeviceBuffer::allocate(q_floats * 4)));
    outputs.push_back(take(DeviceBuffer::allocate(q_floats * 4)));
    plans.push_back(take(gpu.plan_decode(layer, 2 * shape.kv_heads[layer], shape.capacity)));
    workspaces.push_back(take(DeviceBuffer::allocate(std::max<std::uint64_t>(plans.back().workspace_bytes, 4))));
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  for (std::uint32_t layer = 0; layer < layers; ++layer) {
    const std::size_t row_bytes = std::size_t{shape.kv_heads[layer]} * d * 2;
    std::vector<LengthAppend> requests;
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      requests.push_back({s, 1, DType::BF16, static_cast<std::uint8_t*>(token_k[layer].data()) + s * row_bytes,
                          static_cast<std::uint8_t*>(token_v[layer].data()) + s * row_bytes});
    }
    const Status a = gpu.append_at_length(layer, requests, shape.capacity, stream);
    EXPECT_TRUE(a.ok()) << a.error().to_string();
    const Status dec = gpu.decode(layer, plans[layer], static_cast<const float*>(queries[layer].data()), nullptr, 0.0f,
                                  static_cast<float*>(outputs[layer].data()), workspaces[layer].data(), stream);
    EXPECT_TRUE(dec.ok()) << dec.error().to_string();
  }
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_TRUE(gpu.lengths_on_device());
  for (int replay = 0; replay < 6; ++replay) {
    std::vector<std::vector<float>> q(layers);
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      const std::uint32_t heads = shape.kv_heads[layer];
      const AppendInput in = make_append_input(rng, shape.sequences, heads, d, DType::BF16);  // row s: sequence s
      const std::size_t row_bytes = std::size_t{heads} * d * 2;
      for (std::uint32_t s = 0; s < shape.sequences; ++s) {
        ASSERT_TRUE(cpu.append(layer, s, cpu.length(layer, s), 1, DType::BF16, in.keys.data() + s * row_bytes,
                               in.values.data() + s * row_bytes)
                        .ok());
      }
      ASSERT_TRUE(token_k[layer].upload(in.keys.data(), in.keys.size()).ok());
      ASSERT_TRUE(token_v[layer].upload(in.values.data(), in.values.size()).ok());
      q[layer] = kvcompact::tq::testing::random_rows(rng, std::size_t{shape.sequences} * 2 * heads, d, 1.0f, false);
      ASSERT_TRUE(queries[layer].upload(q[layer].data(), q[layer].size() * 4).ok());
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (std::uint32_t layer = 0; layer < layers; ++layer) {
      std::vector<float> out(q[layer].size());
      ASSERT_TRUE(outputs[layer].download(out.data(), out.size() * 4).ok());
      expect_decode_output_matches_oracle(cpu, layer, 2 * shape.kv_heads[layer], q[layer], out,
                                          "replay " + std::to_string(replay));
    }
    if (replay == 2) {  // a sync between replays: the graph goes on appending at the device lengths
      ASSERT_TRUE(gpu.sync_lengths(stream).ok());
      expect_layers_match(cpu, gpu, {0u, 1u}, "after replay 2");
    }
  }
  EXPECT_EQ(gpu.length(0, 2), prompt[2] + 3) << "replays are invisible to the host until sync_lengths";
  const Status synced = gpu.sync_lengths(stream);
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  EXPECT_EQ(gpu.length(0, 2), prompt[2] + 6);
  expect_layers_match(cpu, gpu, {0u, 1u}, "after 6 replays");
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(CudaAppendAtLength, RefusalsAreKeptUntilSync) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=mse4,v=mse3,nc,w=8", seed);
  const CacheShape shape{.head_dim = 64, .kv_heads = {2, 2}, .sequences = 4, .capacity = 32};
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  const std::uint32_t heads = 2, d = 64;
  for (std::uint32_t layer : {0u, 1u}) {  // 10 rows everywhere (the window of 8 is full)
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const AppendInput in = make_append_input(rng, 10, heads, d, DType::F32);
      ASSERT_TRUE(cpu.append(layer, s, 0, 10, DType::F32, in.keys.data(), in.values.data()).ok());
      ASSERT_TRUE(gpu.append(layer, s, 0, 10, DType::F32, in.device_keys.data(), in.device_values.data()).ok());
    }
  }
  // Step A: layer 0 sequence 2 has a value norm beyond float32, layer 1 sequence 1 a NaN key (2 rows each, so
  // that step B's row at the same length covers only the first of the ring slots a wrong commit would write),
  // and layer 1 sequence 3 appends 3 rows under a max_length of 12 (10 + 3 > 12); the rest is good.
  std::vector<AppendInput> inputs;
  inputs.reserve(16);
  for (std::uint32_t layer : {0u, 1u}) {
    std::vector<LengthAppend> requests;
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const bool long_one = layer == 1 && s == 3;
      const bool bad_input = (layer == 0 && s == 2) || (layer == 1 && s == 1);
      const std::uint32_t rows = long_one ? 3 : bad_input ? 2 : 1;
      AppendInput in = make_append_input(rng, rows, heads, d, DType::F32);
      if (layer == 0 && s == 2) {
        const float big = 3.0e38f;
        for (std::size_t i = 0; i < in.values.size() / 4; ++i) std::memcpy(in.values.data() + 4 * i, &big, 4);
      }
      if (layer == 1 && s == 1) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(in.keys.data() + 4 * 5, &nan, 4);
      }
      ASSERT_TRUE(in.device_keys.upload(in.keys.data(), in.keys.size()).ok());
      ASSERT_TRUE(in.device_values.upload(in.values.data(), in.values.size()).ok());
      const bool refused = bad_input || long_one;
      if (!refused) {
        ASSERT_TRUE(cpu.append(layer, s, 10, 1, DType::F32, in.keys.data(), in.values.data()).ok());
      }
      requests.push_back({s, rows, DType::F32, in.device_keys.data(), in.device_values.data()});
      inputs.push_back(std::move(in));
    }
    ASSERT_TRUE(gpu.append_at_length(layer, requests, layer == 1 ? 12 : shape.capacity).ok());
  }
  // Step B: one good row everywhere; the refused sequences append at their unchanged lengths.
  for (std::uint32_t layer : {0u, 1u}) {
    std::vector<LengthAppend> requests;
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      inputs.push_back(make_append_input(rng, 1, heads, d, DType::BF16));
      const AppendInput& in = inputs.back();
      ASSERT_TRUE(cpu.append(layer, s, cpu.length(layer, s), 1, DType::BF16, in.keys.data(), in.values.data()).ok());
      requests.push_back({s, 1, DType::BF16, in.device_keys.data(), in.device_values.data()});
    }
    ASSERT_TRUE(gpu.append_at_length(layer, requests, shape.capacity).ok());
  }
  const Status synced = gpu.sync_lengths();
  ASSERT_FALSE(synced.ok());
  EXPECT_EQ(synced.error().code, ErrorCode::OutOfRange);  // (layer 0, sequence 2) comes first
  EXPECT_NE(synced.error().message.find("layer 0 sequence 2 at position 10"), std::string::npos)
      << synced.error().message;
  for (std::uint32_t layer : {0u, 1u}) {
    for (std::uint32_t s = 0; s < shape.sequences; ++s) {
      const std::string where = "layer " + std::to_string(layer) + " seq " + std::to_string(s);
      const bool refused = (layer == 0 && s == 2) || (layer == 1 && s == 1) || (layer == 1 && s == 3);
      const auto a = take(cpu.snapshot(layer, s));
      const auto b = take(gpu.snapshot(layer, s));
      ASSERT_EQ(b.length, refused ? 11u : 12u) << where;  // 10 rows, then steps A and B
      // Every refusal stored nothing, the exact window included (its full ring is the CPU's, byte for byte).
      expect_same_snapshot(a, b, where);
    }
  }
  // The refusals were reported once: the next sync has none.
  EXPECT_TRUE(gpu.sync_lengths().ok());
  // A refusal at the limit alone is CapacityExceeded (12 + 2 rows > 12).
  const AppendInput two = make_append_input(rng, 2, heads, d, DType::F32);
  const LengthAppend over{0, 2, DType::F32, two.device_keys.data(), two.device_values.data()};
  ASSERT_TRUE(gpu.append_at_length(0, {&over, 1}, 12).ok());
  const Status beyond = gpu.sync_lengths();
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.error().code, ErrorCode::CapacityExceeded);
  EXPECT_NE(beyond.error().message.find("layer 0 sequence 0 at position 12"), std::string::npos)
      << beyond.error().message;
  EXPECT_EQ(gpu.length(0, 0), 12u);
}

TEST(CudaAppendAtLength, DeviceLengthRulesAreTypedErrors) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const QuantConfig config = QuantConfig::seed_system(9);
  const CacheShape shape{.head_dim = 64, .kv_heads = {1, 0, 1}, .sequences = 3, .capacity = 16};
  auto gpu = take(DeviceCache::create(shape, config));
  std::vector<float> rows(4 * 64, 0.25f);
  auto drows = take(DeviceBuffer::allocate(rows.size() * 4));
  ASSERT_TRUE(drows.upload(rows.data(), rows.size() * 4).ok());
  const void* dv = drows.data();
  auto code_of = [](const Status& st) { return st.ok() ? ErrorCode::Internal : st.error().code; };
  EXPECT_TRUE(gpu.sync_lengths().ok());  // nothing on the device
  const LengthAppend one{0, 1, DType::F32, dv, dv};
  EXPECT_EQ(code_of(gpu.append_at_length(3, {&one, 1}, 16)), ErrorCode::OutOfRange);        // no layer 3
  EXPECT_EQ(code_of(gpu.append_at_length(1, {&one, 1}, 16)), ErrorCode::InvalidArgument);   // no attention
  EXPECT_EQ(code_of(gpu.append_at_length(0, {&one, 1}, 17)), ErrorCode::CapacityExceeded);  // beyond capacity
  const LengthAppend five{0, 5, DType::F32, dv, dv};
  EXPECT_EQ(code_of(gpu.append_at_length(0, {&five, 1}, 4)), ErrorCode::CapacityExceeded);  // rows > max_length
  const LengthAppend bad_seq{3, 1, DType::F32, dv, dv};
  EXPECT_EQ(code_of(gpu.append_at_length(0, {&bad_seq, 1}, 16)), ErrorCode::OutOfRange);
  const LengthAppend fp8{0, 1, DType::F8E4M3, dv, dv};
  EXPECT_EQ(code_of(gpu.append_at_length(0, {&fp8, 1}, 16)), ErrorCode::Unsupported);
  const LengthAppend null_rows{0, 1, DType::F32, nullptr, dv};
  EXPECT_EQ(code_of(gpu.append_at_length(0, {&null_rows, 1}, 16)), ErrorCode::InvalidArgument);
  const LengthAppend twice[] = {one, one};
  EXPECT_EQ(code_of(gpu.append_at_length(0, twice, 16)), ErrorCode::InvalidArgument);
  EXPECT_FALSE(gpu.lengths_on_device()) << "refused calls launch nothing";

  ASSERT_TRUE(gpu.append_at_length(0, {&one, 1}, 8).ok());
  EXPECT_TRUE(gpu.lengths_on_device());
  EXPECT_EQ(gpu.length(0, 0), 0u) << "the host keeps the last sync's lengths";
  auto expect_sync_error = [](const Status& st, const char* what) {
    ASSERT_FALSE(st.ok()) << what;
    EXPECT_EQ(st.error().code, ErrorCode::InvalidArgument) << what;
    EXPECT_NE(st.error().message.find("sync_lengths"), std::string::npos) << what << ": " << st.error().message;
  };
  const AppendRequest at_zero{1, 0, 1, DType::F32, dv, dv};
  expect_sync_error(gpu.append(0, 1, 0, 1, DType::F32, dv, dv), "append");
  expect_sync_error(gpu.append_batch(0, {&at_zero, 1}), "append_batch");
  expect_sync_error(gpu.append_deferred(0, {&at_zero, 1}), "append_deferred");
  expect_sync_error(gpu.truncate(0, 0), "truncate");
  expect_sync_error(gpu.truncate_layer(0, 0, 0), "truncate_layer");
  expect_sync_error(gpu.reset(1), "reset");
  const auto snap = gpu.snapshot(0, 0);
  ASSERT_FALSE(snap.ok());
  EXPECT_EQ(snap.error().code, ErrorCode::InvalidArgument);
  // Decode needs a plan that covers the max_length given to append_at_length (8).
  const auto short_plan = take(gpu.plan_decode(0, 2, 4));
  auto ws = take(DeviceBuffer::allocate(std::max<std::uint64_t>(short_plan.workspace_bytes, 4)));
  auto q = take(DeviceBuffer::allocate(3 * 2 * 64 * 4));
  ASSERT_TRUE(q.fill(0).ok());
  auto* qf = static_cast<float*>(q.data());
  EXPECT_EQ(code_of(gpu.decode(0, short_plan, qf, nullptr, 0.0f, qf, ws.data())), ErrorCode::OutOfRange);
  const auto plan = take(gpu.plan_decode(0, 2, 8));
  auto ws8 = take(DeviceBuffer::allocate(std::max<std::uint64_t>(plan.workspace_bytes, 4)));
  auto out = take(DeviceBuffer::allocate(3 * 2 * 64 * 4));
  EXPECT_TRUE(gpu.decode(0, plan, qf, nullptr, 0.0f, static_cast<float*>(out.data()), ws8.data()).ok());
  // More appends at the device lengths are fine (the same sequence again: it is stream-ordered).
  ASSERT_TRUE(gpu.append_at_length(0, {&one, 1}, 8).ok());
  ASSERT_TRUE(gpu.append_at_length(2, {&one, 1}, 16).ok());
  const Status synced = gpu.sync_lengths();
  ASSERT_TRUE(synced.ok()) << synced.error().to_string();
  EXPECT_FALSE(gpu.lengths_on_device());
  EXPECT_EQ(gpu.length(0, 0), 2u);
  EXPECT_EQ(gpu.length(2, 0), 1u);
  EXPECT_TRUE(gpu.snapshot(0, 0).ok());
  EXPECT_TRUE(gpu.append(0, 0, 2, 1, DType::F32, dv, dv).ok());
  // Deferred appends pending: append_at_length and sync_lengths wait for finish_appends.
  const AppendRequest deferred{1, 0, 1, DType::F32, dv, dv};
  ASSERT_TRUE(gpu.append_deferred(0, {&deferred, 1}).ok());
  EXPECT_EQ(code_of(gpu.append_at_length(2, {&one, 1}, 16)), ErrorCode::InvalidArgument);
  EXPECT_EQ(code_of(gpu.sync_lengths()), ErrorCode::InvalidArgument);
  ASSERT_TRUE(gpu.finish_appends().ok());
  // reset_all takes the lengths back from the device (and empties everything).
  ASSERT_TRUE(gpu.append_at_length(0, {&one, 1}, 16).ok());
  gpu.reset_all();
  EXPECT_FALSE(gpu.lengths_on_device());
  EXPECT_EQ(gpu.length(0, 0), 0u);
  EXPECT_TRUE(gpu.append(0, 0, 0, 1, DType::F32, dv, dv).ok());
  EXPECT_TRUE(gpu.sync_lengths().ok());
  EXPECT_EQ(gpu.length(0, 0), 1u);
}

}  // namespace
}  // namespace kvcompact::cuda::tq
