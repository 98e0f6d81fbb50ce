// DeviceCache::append_batch (several sequences of one layer, one wait): random batches of random sizes, dtypes
// and sequence orders must leave exactly the bytes and lengths of a CPU TurboQuantCache that received the same
// appends one by one, and decode over them must match the float64 oracle; a batch with bad input stores its
// good requests and reports the first bad one; host-side errors (checked before anything runs) store nothing
// and equal append's errors. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/cuda/tq_cache.hpp"
#include "kvcompact/tq/cache.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/layout.hpp"
#include "unit/tq/attention_test_util.hpp"
#include "cuda/cuda_test_util.hpp"
#include "cuda/append_inputs.hpp"
#include "cuda/device_cache_checks.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::expect_decode_matches_oracle;
using kvcompact::cuda::testing::expect_same_snapshot;
using kvcompact::cuda::testing::take;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;

using Input = kvcompact::cuda::testing::AppendInput;

Input make_input(std::mt19937_64& rng, std::uint32_t rows, std::uint32_t heads, std::uint32_t d, DType dtype) {
  return kvcompact::cuda::testing::make_append_input(rng, rows, heads, d, dtype);
}

void expect_same_layer(const TurboQuantCache& cpu, const DeviceCache& gpu, std::uint32_t layer, std::uint32_t sequences,
                       const std::string& where) {
  for (std::uint32_t s = 0; s < sequences; ++s) {
    ASSERT_EQ(cpu.length(layer, s), gpu.length(layer, s)) << where << " seq " << s;
    expect_same_snapshot(take(cpu.snapshot(layer, s)), take(gpu.snapshot(layer, s)), where + " seq " + std::to_string(s));
  }
}

TEST(CudaAppendBatch, MatchesTheCpuCacheAppendingOneByOne) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  for (const char* mode : {"k=prod3,v=mse2,w=16", "k=mse4,v=mse3,nc"}) {
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string("mode ") + mode + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    CacheShape shape;
    shape.head_dim = 128;
    shape.kv_heads = {2, 4};
    shape.sequences = 6;
    shape.capacity = 160;
    auto cpu = take(TurboQuantCache::create(shape, config));
    auto gpu = take(DeviceCache::create(shape, config));
    const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
    for (int round = 0; round < 8; ++round) {
      const std::uint32_t layer = static_cast<std::uint32_t>(rng() % 2), heads = shape.kv_heads[layer];
      // A random subset of the sequences in random order; decode-like single rows in most rounds.
      const std::vector<std::uint32_t> seqs = kvcompact::cuda::testing::random_sequence_subset(rng, shape.sequences);
      std::vector<Input> inputs;
      std::vector<AppendRequest> requests;
      inputs.reserve(seqs.size());
      for (std::uint32_t s : seqs) {
        const std::uint32_t length = cpu.length(layer, s), room = shape.capacity - length;
        const std::uint32_t rows = std::min<std::uint32_t>(room, round % 3 == 0 ? static_cast<std::uint32_t>(rng() % 40) : 1u);
        const DType dtype = dtypes[rng() % 3];
        inputs.push_back(make_input(rng, rows, heads, shape.head_dim, dtype));
        const Input& in = inputs.back();
        ASSERT_TRUE(cpu.append(layer, s, length, rows, dtype, in.keys.data(), in.values.data()).ok());
        requests.push_back({s, length, rows, dtype, in.device_keys.data(), in.device_values.data()});
      }
      const Status st = gpu.append_batch(layer, requests);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      expect_same_layer(cpu, gpu, layer, shape.sequences, "round " + std::to_string(round));
    }
    // Decode over the batched appends (the device mirror of the lengths and window starts) against the oracle.
    for (std::uint32_t layer : {0u, 1u}) expect_decode_matches_oracle(cpu, gpu, layer, 8, rng);
  }
}

// Device copies of an input shifted by `shift` bytes from their 256-byte aligned allocation: a shift that is not a
// multiple of 16 sends the request to the general encode kernel (the fast one needs 16-byte aligned rows).
struct ShiftedInput {
  DeviceBuffer keys, values;
  std::size_t shift = 0;
  const void* key_rows() const { return static_cast<const std::uint8_t*>(keys.data()) + shift; }
  const void* value_rows() const { return static_cast<const std::uint8_t*>(values.data()) + shift; }
};

ShiftedInput shifted_copy(const Input& in, std::size_t shift) {
  ShiftedInput out;
  out.shift = shift;
  out.keys = take(DeviceBuffer::allocate(in.keys.size() + 16));
  out.values = take(DeviceBuffer::allocate(in.values.size() + 16));
  EXPECT_TRUE(out.keys.upload(in.keys.data(), in.keys.size(), shift).ok());
  EXPECT_TRUE(out.values.upload(in.values.data(), in.values.size(), shift).ok());
  return out;
}

// More requests than one encode launch takes (kEncodeBatchMax = 32 per input dtype), three dtypes and
// misaligned inputs (the general kernel) in one batch: the launches share the requests out, and every byte must
// still be what the CPU cache stores appending one by one.
TEST(CudaAppendBatch, ManySequencesMixedDtypesAndKernels) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  for (const std::uint32_t d : {64u, 128u, 256u}) {
    const char* mode = d == 128 ? "k=mse4,v=mse3,nc,w=4" : d == 64 ? "k=prod3,v=mse2" : "k=mse3,v=mse4";
    const std::uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string("mode ") + mode + " d " + std::to_string(d) + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const QuantConfig config = *QuantConfig::parse(mode, seed);
    CacheShape shape;
    shape.head_dim = d;
    shape.kv_heads = {3};
    shape.sequences = 75;
    shape.capacity = 40;
    auto cpu = take(TurboQuantCache::create(shape, config));
    auto gpu = take(DeviceCache::create(shape, config));
    const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
    for (int round = 0; round < 4; ++round) {
      // Every sequence but a few, in random order; round 0 appends 0–20 rows, the others one row (a decode step).
      std::vector<std::uint32_t> seqs(shape.sequences);
      std::iota(seqs.begin(), seqs.end(), 0u);
      std::shuffle(seqs.begin(), seqs.end(), rng);
      seqs.resize(shape.sequences - rng() % 4);
      // Mostly one dtype, as a model's step is; in round 2 every request draws its own.
      const DType step_dtype = dtypes[rng() % 3];
      std::vector<Input> inputs;
      std::vector<ShiftedInput> shifted;
      std::vector<AppendRequest> requests;
      inputs.reserve(seqs.size());
      shifted.reserve(seqs.size());
      for (std::uint32_t s : seqs) {
        const std::uint32_t length = cpu.length(0, s);
        const std::uint32_t rows = round == 0 ? static_cast<std::uint32_t>(rng() % 21) : 1u;
        const DType dtype = round == 2 ? dtypes[rng() % 3] : step_dtype;
        inputs.push_back(make_input(rng, rows, 3, d, dtype));
        const Input& in = inputs.back();
        ASSERT_TRUE(cpu.append(0, s, length, rows, dtype, in.keys.data(), in.values.data()).ok());
        // One request in eight reads rows 4 bytes past a 16-byte boundary (element-aligned for every dtype).
        if (rng() % 8 == 0) {
          shifted.push_back(shifted_copy(in, 4));
          requests.push_back({s, length, rows, dtype, shifted.back().key_rows(), shifted.back().value_rows()});
        } else {
          requests.push_back({s, length, rows, dtype, in.device_keys.data(), in.device_values.data()});
        }
      }
      const Status st = gpu.append_batch(0, requests);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      expect_same_layer(cpu, gpu, 0, shape.sequences, "round " + std::to_string(round));
    }
    expect_decode_matches_oracle(cpu, gpu, 0, 6, rng);  // group of 2
  }
}

// encode_append_batch itself (below DeviceCache): every request is checked before anything is launched, a sequence
// may appear once, and a batch's records equal those of encode_append called per request.
TEST(CudaAppendBatch, EncodeAppendBatchChecksFirstAndMatchesSingleAppends) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=prod4,v=mse3,w=4", seed);
  const std::uint32_t d = 128, heads = 2, sequences = 40, capacity = 16;
  const auto codec = take(kvcompact::tq::LayerCodec::create(d, config, 3));
  const auto layout = take(kvcompact::tq::plan_layer_layout(d, heads, sequences, capacity, config));
  const auto dcodec = take(DeviceCodec::create(codec));
  auto batched = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  auto single = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  ASSERT_TRUE(batched.fill(0).ok());
  ASSERT_TRUE(single.fill(0).ok());
  std::vector<Input> inputs;
  std::vector<EncodeRequest> requests;
  inputs.reserve(sequences);
  for (std::uint32_t s = 0; s < sequences; ++s) {
    const std::uint32_t rows = static_cast<std::uint32_t>(rng() % 7);  // 0–6, a request of 0 rows included
    inputs.push_back(make_input(rng, rows, heads, d, DType::BF16));
    requests.push_back({s, 3, rows, DType::BF16, inputs.back().device_keys.data(), inputs.back().device_values.data(),
                        nullptr});
  }
  // A bad request anywhere fails the whole call before a launch: the layer stays all zeros.
  const std::vector<std::uint8_t> zeros(layout.total_bytes, 0);
  std::vector<std::uint8_t> bytes(layout.total_bytes);
  auto expect_nothing_written = [&](const char* what) {
    ASSERT_TRUE(synchronize().ok());
    ASSERT_TRUE(batched.download(bytes.data(), bytes.size()).ok());
    EXPECT_TRUE(bytes == zeros) << what;
  };
  std::vector<EncodeRequest> bad = requests;
  bad[37].position = capacity;  // rows past the capacity (when it has rows) ...
  bad[37].rows = 1;
  Status st = encode_append_batch(layout, dcodec, batched.data(), bad);
  EXPECT_EQ(st.error().code, ErrorCode::CapacityExceeded);
  expect_nothing_written("capacity");
  bad = requests;
  bad[21].seq = 4;  // sequence 4 twice
  st = encode_append_batch(layout, dcodec, batched.data(), bad);
  EXPECT_EQ(st.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(st.error().message.find("sequence 4 appears more than once"), std::string::npos) << st.error().message;
  expect_nothing_written("duplicate");
  bad = requests;
  bad[30].seq = sequences;
  EXPECT_EQ(encode_append_batch(layout, dcodec, batched.data(), bad).error().code, ErrorCode::OutOfRange);
  expect_nothing_written("sequence range");
  // The good batch (40 requests: two fast launches) against one encode_append per request.
  st = encode_append_batch(layout, dcodec, batched.data(), requests);
  ASSERT_TRUE(st.ok()) << st.error().to_string();
  for (const EncodeRequest& r : requests) ASSERT_TRUE(encode_append(layout, dcodec, single.data(), r).ok());
  ASSERT_TRUE(synchronize().ok());
  std::vector<std::uint8_t> expected(layout.total_bytes);
  ASSERT_TRUE(batched.download(bytes.data(), bytes.size()).ok());
  ASSERT_TRUE(single.download(expected.data(), expected.size()).ok());
  EXPECT_TRUE(bytes == expected);
  EXPECT_FALSE(bytes == zeros);
}

TEST(CudaAppendBatch, StoresTheGoodRequestsAndReportsTheFirstBadOne) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=mse4,v=mse3,nc,w=8", seed);
  CacheShape shape;
  shape.head_dim = 64;
  shape.kv_heads = {2};
  shape.sequences = 5;
  shape.capacity = 64;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  const std::uint32_t heads = 2, d = 64;
  // Every sequence holds 10 rows first, so the exact window (8) is full when the bad rows arrive.
  for (std::uint32_t s = 0; s < shape.sequences; ++s) {
    const Input in = make_input(rng, 10, heads, d, DType::F32);
    ASSERT_TRUE(cpu.append(0, s, 0, 10, DType::F32, in.keys.data(), in.values.data()).ok());
    ASSERT_TRUE(gpu.append(0, s, 0, 10, DType::F32, in.device_keys.data(), in.device_values.data()).ok());
  }
  // Sequences 3, 1, 4, 0 in that order; 1 gets a NaN key, 4 a value too large for a float32 norm.
  const std::uint32_t order[] = {3, 1, 4, 0};
  std::vector<Input> inputs;
  std::vector<AppendRequest> requests;
  for (std::uint32_t s : order) {
    Input in = make_input(rng, 3, heads, d, DType::F32);
    if (s == 1) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(in.keys.data() + 4 * 77, &nan, 4);
    }
    if (s == 4) {
      for (std::size_t i = 0; i < in.values.size() / 4; ++i) {
        const float big = 3.0e38f;
        std::memcpy(in.values.data() + 4 * i, &big, 4);
      }
    }
    ASSERT_TRUE(in.device_keys.upload(in.keys.data(), in.keys.size()).ok());
    ASSERT_TRUE(in.device_values.upload(in.values.data(), in.values.size()).ok());
    const Status c = cpu.append(0, s, 10, 3, DType::F32, in.keys.data(), in.values.data());
    EXPECT_EQ(c.ok(), s != 1 && s != 4) << "seq " << s;
    requests.push_back({s, 10, 3, DType::F32, in.device_keys.data(), in.device_values.data()});
    inputs.push_back(std::move(in));
  }
  const Status st = gpu.append_batch(0, requests);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::NonFinite);  // sequence 1 comes before sequence 4
  EXPECT_NE(st.error().message.find("sequence 1 "), std::string::npos) << st.error().message;
  for (std::uint32_t s = 0; s < shape.sequences; ++s) {
    EXPECT_EQ(gpu.length(0, s), (s == 0 || s == 3) ? 13u : 10u) << "seq " << s;
  }
  // Every sequence carries the CPU's bytes: the stored ones their new rows, the rejected ones their old length
  // and their full exact window, which the rejected rows did not touch.
  for (std::uint32_t s = 0; s < shape.sequences; ++s) {
    expect_same_snapshot(take(cpu.snapshot(0, s)), take(gpu.snapshot(0, s)), "seq " + std::to_string(s));
  }
  // The device's window starts agree: decode over the full windows matches the oracle over the CPU cache.
  expect_decode_matches_oracle(cpu, gpu, 0, 4, rng);
  // The same bad request alone gives the error append gives.
  const Status one = gpu.append(0, 4, 10, 3, DType::F32, requests[2].keys, requests[2].values);
  EXPECT_EQ(one.error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(gpu.length(0, 4), 10u);
}

// Element `index` of host rows in `dtype` set to `value` (rounded to the dtype: 3e38 is finite in bf16, inf in f16).
void store_element(std::vector<std::uint8_t>& bytes, DType dtype, std::size_t index, float value) {
  if (dtype == DType::F32) {
    std::memcpy(bytes.data() + 4 * index, &value, 4);
    return;
  }
  const std::uint16_t bits = dtype == DType::BF16 ? f32_to_bf16(value) : f32_to_f16(value);
  std::memcpy(bytes.data() + 2 * index, &bits, 2);
}

// The commit kernel writes the exact-window ring rows of the accepted requests only (append_commit.hpp): a wide
// window (70 slots) that long appends fill and wrap (up to 64 blocks per request), more requests than one commit
// launch takes (32), three input dtypes, and rejected appends whose good rows would each have overwritten a
// slot of the full window — after every batch each sequence's bytes (ring and window start included) are the CPU
// cache's, which refuses the same appends one by one. A bad row sits anywhere in its request (also before the
// last 70 rows, which alone reach the ring), in any dtype, and from round 2 one of the second commit launch's
// requests (33rd to 36th) is always bad.
TEST(CudaAppendBatch, RingRowsAreWrittenOnlyForAcceptedAppends) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = *QuantConfig::parse("k=prod3,v=mse3,w=70", seed);
  const CacheShape shape{.head_dim = 64, .kv_heads = {2}, .sequences = 36, .capacity = 420};
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  const std::uint32_t heads = 2, d = 64;
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  const std::uint32_t long_rows[] = {0, 1, 37, 69, 70, 71, 140, 201};
  for (int round = 0; round < 4; ++round) {
    std::vector<std::uint32_t> seqs(shape.sequences);
    std::iota(seqs.begin(), seqs.end(), 0u);
    std::shuffle(seqs.begin(), seqs.end(), rng);
    const std::size_t second_launch_bad = 32 + rng() % 4;  // request index
    std::vector<Input> inputs;
    std::vector<AppendRequest> requests;
    inputs.reserve(seqs.size());
    Status first_cpu_error = ok_status();
    std::uint32_t rejected = 0, first_rejected_seq = 0;
    for (std::uint32_t s : seqs) {
      const std::uint32_t length = cpu.length(0, s), room = shape.capacity - length;
      // Rounds 0 and 2: long appends; 1 and 3: a decode step's single rows.
      // (The second launch's bad request gets a row at least: room is never 0 here, capacity 420 > 2 · 201 + 2.)
      const bool second_launch = round >= 2 && requests.size() == second_launch_bad;
      const std::uint32_t rows =
          std::min(room, std::max(second_launch ? 1u : 0u, round % 2 == 0 ? long_rows[rng() % 8] : 1u));
      // From round 2 on, one request in five is bad in one row: a NaN key, or a value norm beyond float32.
      const bool chosen = second_launch || rng() % 5 == 0;
      const int bad = round >= 2 && rows > 0 && chosen ? 1 + static_cast<int>(rng() % 2) : 0;
      const DType dtype = dtypes[rng() % 3];
      Input in = make_input(rng, rows, heads, d, dtype);
      if (bad != 0) {
        const std::size_t row = (rng() % rows) * std::size_t{heads} * d;
        if (bad == 1) store_element(in.keys, dtype, row + d + 3, std::numeric_limits<float>::quiet_NaN());
        for (std::size_t i = 0; bad == 2 && i < std::size_t{heads} * d; ++i) {
          store_element(in.values, dtype, row + i, 3.0e38f);
        }
        ASSERT_TRUE(in.device_keys.upload(in.keys.data(), in.keys.size()).ok());
        ASSERT_TRUE(in.device_values.upload(in.values.data(), in.values.size()).ok());
      }
    const Status c = cpu.append(0, s, length, rows, dtype, in.keys.data(), in.values.data());
      ASSERT_EQ(c.ok(), bad == 0) << "seq " << s;
      if (!c.ok()) {
        ++rejected;
        if (first_cpu_error.ok()) {
          first_cpu_error = c;
          first_rejected_seq = s;
        }
      }
      requests.push_back({s, length, rows, dtype, in.device_keys.data(), in.device_values.data()});
      inputs.push_back(std::move(in));
    }
    const Status st = gpu.append_batch(0, requests);
    const std::string where = "round " + std::to_string(round) + " (" + std::to_string(rejected) + " rejected)";
    ASSERT_EQ(st.ok(), first_cpu_error.ok()) << where;
    if (!st.ok()) {
      // The first rejected request in request order, with the CPU's error code (the messages are worded apart).
      EXPECT_EQ(st.error().code, first_cpu_error.error().code) << where;
      EXPECT_NE(st.error().message.find("sequence " + std::to_string(first_rejected_seq) + " "), std::string::npos)
          << where << ": " << st.error().message;
    }
    expect_same_layer(cpu, gpu, 0, shape.sequences, where);
  }
  expect_decode_matches_oracle(cpu, gpu, 0, 4, rng);
}

TEST(CudaAppendBatch, HostChecksRunBeforeAnythingIsStored) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  const QuantConfig config = QuantConfig::seed_system(3);
  CacheShape shape;
  shape.head_dim = 64;
  shape.kv_heads = {1, 0};
  shape.sequences = 3;
  shape.capacity = 8;
  auto cpu = take(TurboQuantCache::create(shape, config));
  auto gpu = take(DeviceCache::create(shape, config));
  std::vector<float> rows(8 * 64, 0.5f);
  auto drows = take(DeviceBuffer::allocate(rows.size() * 4));
  ASSERT_TRUE(drows.upload(rows.data(), rows.size() * 4).ok());
  const void* dv = drows.data();
  const AppendRequest good0{0, 0, 2, DType::F32, dv, dv}, good2{2, 0, 1, DType::F32, dv, dv};
  // Each bad request sits between good ones and gets the CPU cache's append error (code, message, expected /
  // actual); nothing is stored.
  const AppendRequest bad[] = {{1, 1, 1, DType::F32, dv, dv},    {1, 0, 9, DType::F32, dv, dv},
                               {1, 0, 1, DType::F8E4M3, dv, dv}, {1, 0, 1, DType::F32, nullptr, dv},
                               {7, 0, 1, DType::F32, dv, dv}};
  for (const AppendRequest& b : bad) {
    const AppendRequest batch[] = {good0, b, good2};
    const Status st = gpu.append_batch(0, batch);
    const Status on_cpu = cpu.append(0, b.seq, b.position, b.rows, b.dtype, b.keys ? rows.data() : nullptr,
                                     b.values ? rows.data() : nullptr);
    ASSERT_FALSE(st.ok());
    ASSERT_FALSE(on_cpu.ok());
    EXPECT_EQ(st.error().code, on_cpu.error().code);
    EXPECT_EQ(st.error().message, on_cpu.error().message);
    EXPECT_EQ(st.error().expected, on_cpu.error().expected);
    EXPECT_EQ(st.error().actual, on_cpu.error().actual);
    for (std::uint32_t s = 0; s < shape.sequences; ++s) EXPECT_EQ(gpu.length(0, s), 0u);
  }
  // The layer is checked first, as the CPU cache checks it, even for an empty batch.
  for (std::uint32_t layer : {1u, 2u}) {
    const Status st = gpu.append_batch(layer, {});
    const Status on_cpu = cpu.append(layer, 0, 0, 1, DType::F32, rows.data(), rows.data());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, on_cpu.error().code);
    EXPECT_EQ(st.error().message, on_cpu.error().message);
  }
  EXPECT_TRUE(gpu.append_batch(0, {}).ok());
  // (A second request for sequence 0 that append's checks alone would accept: position 0 = its length.)
  const AppendRequest twice[] = {good0, good2, {0, 0, 1, DType::F32, dv, dv}};
  const Status dup = gpu.append_batch(0, twice);
  EXPECT_EQ(dup.error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(gpu.length(0, 0), 0u);
  // Requests of 0 rows pass whatever their dtype and pointers and store nothing; the others are stored.
  const AppendRequest zero{1, 0, 0, DType::F8E4M3, nullptr, nullptr};
  EXPECT_TRUE(gpu.append_batch(0, {&zero, 1}).ok());
  const AppendRequest mixed[] = {zero, good0, good2};
  const Status ok = gpu.append_batch(0, mixed);
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  EXPECT_EQ(gpu.length(0, 0), 2u);
  EXPECT_EQ(gpu.length(0, 1), 0u);
  EXPECT_EQ(gpu.length(0, 2), 1u);
}

}  // namespace
}  // namespace kvcompact::cuda::tq
