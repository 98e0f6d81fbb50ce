// The CUDA TurboQuant backend against the CPU code on fresh random inputs: encode bytes against the CPU
// cache's LayerCodec (every key / value mode, head dims 16 ... 576, f32 / bf16 / f16 input), and fused decode
// attention against the float64 oracle (modes, head_dim 64 / 128 / 256, GQA 1 / 4 / 8 / 16, ragged lengths
// 1, 7, 127, 128, 129, 600 and long ones, sinks and the exact window on and off, output poisoned).
// Every test skips with a message when no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/attention_oracle.hpp"
#include "kvcompact/tq/cache.hpp"
#include "unit/tq/attention_test_util.hpp"
#include "cuda/cuda_test_util.hpp"
#include "cuda/params.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::take;
using kvcompact::cuda::testing::to_dtype;

using kvcompact::tq::AttentionOptions;
using kvcompact::tq::AttentionRequest;
using kvcompact::tq::CacheShape;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::TurboQuantCache;
using kvcompact::tq::testing::fresh_seed;
using kvcompact::tq::testing::max_row_relative_error;
using kvcompact::tq::testing::random_rows;

QuantConfig parse_mode(const std::string& mode, std::uint64_t seed) {
  auto r = QuantConfig::parse(mode, seed);
  EXPECT_TRUE(r.ok()) << mode;
  return *r;
}

struct RegionCount {
  const char* name;
  std::uint64_t offset, record_bytes, records;
};

TEST(CudaRuntime, ReportsDeviceAndChecksCopies) {
  SKIP_WITHOUT_GPU();
  auto props = take(device_properties(0));
  EXPECT_GT(props.multiprocessors, 0);
  auto buffer = take(DeviceBuffer::allocate(64));
  std::vector<std::uint8_t> host(65);
  EXPECT_EQ(buffer.upload(host.data(), 65).error().code, ErrorCode::OutOfRange);
  EXPECT_EQ(buffer.download(host.data(), 8, 60).error().code, ErrorCode::OutOfRange);
  // An impossible allocation is a typed error naming the CUDA call, not a crash.
  auto huge = DeviceBuffer::allocate(std::uint64_t{1} << 50);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message.find("cudaMalloc"), std::string::npos) << huge.error().message;
}

// Encode on the GPU and on the CPU cache; compare every region record by record.
void check_encode(const std::string& mode, std::uint32_t d, DType dtype, std::uint64_t seed) {
  SCOPED_TRACE("mode " + mode + " head_dim " + std::to_string(d) + " dtype " + std::string(dtype_name(dtype)) +
               " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = parse_mode(mode, seed);
  CacheShape shape;
  shape.head_dim = d;
  shape.kv_heads = {0, 3};  // layer 1 is the attention layer: the layer index enters the rotation seed
  shape.sequences = 2;
  shape.capacity = 301;
  auto cache = take(TurboQuantCache::create(shape, config));
  const auto& layout = *cache.layout(1);
  auto codec = take(DeviceCodec::create(*cache.codec(1)));
  auto layer = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  ASSERT_OK(layer.fill(0));
  auto status = take(DeviceBuffer::allocate(4));
  ASSERT_OK(status.fill(0));
  const std::uint32_t appends[2][2] = {{37, 200}, {1, 300}};
  for (std::uint32_t seq = 0; seq < 2; ++seq) {
    std::uint32_t position = 0;
    for (std::uint32_t rows : appends[seq]) {
      const std::uint32_t count = rows * 3;
      std::vector<float> keys = random_rows(rng, count, d, 1.0f, true);
      std::vector<float> values = random_rows(rng, count, d, 0.5f, false);
      if (seq == 1 && position == 0) std::fill(keys.begin(), keys.begin() + d, 0.0f);  // a zero key
      const auto kb = to_dtype(keys, dtype), vb = to_dtype(values, dtype);
      ASSERT_OK(cache.append(1, seq, position, rows, dtype, kb.data(), vb.data()));
      auto dk = take(DeviceBuffer::allocate(kb.size()));
      auto dv = take(DeviceBuffer::allocate(vb.size()));
      ASSERT_OK(dk.upload(kb.data(), kb.size()));
      ASSERT_OK(dv.upload(vb.data(), vb.size()));
      EncodeRequest req;
      req.seq = seq;
      req.position = position;
      req.rows = rows;
      req.dtype = dtype;
      req.keys = dk.data();
      req.values = dv.data();
      req.status = static_cast<std::uint32_t*>(status.data());
      ASSERT_OK(encode_append(layout, codec, layer.data(), req));
      ASSERT_OK(synchronize());
      position += rows;
    }
  }
  std::uint32_t flags = 1234;
  ASSERT_OK(status.download(&flags, 4));
  EXPECT_EQ(flags, 0u);
  std::vector<std::uint8_t> gpu(layout.total_bytes);
  ASSERT_OK(layer.download(gpu.data(), gpu.size()));
  const std::uint8_t* cpu = cache.view(1).data;
  const std::uint64_t slots = std::uint64_t{layout.sequences} * layout.kv_heads * layout.capacity;
  const std::uint64_t wrows = std::uint64_t{layout.sequences} * layout.kv_heads * layout.exact_window;
  const RegionCount regions[] = {
      {"key codes", layout.key_codes_offset, layout.token.key_codes, slots},
      {"key signs", layout.key_signs_offset, layout.token.key_signs, slots},
      {"key norms", layout.key_norms_offset, 4, slots},
      {"key residual norms", layout.key_residual_norms_offset, layout.token.key_residual_norm, slots},
      {"value codes", layout.value_codes_offset, layout.token.value_codes, slots},
      {"value norms", layout.value_norms_offset, 4, slots},
      {"window keys", layout.window_keys_offset, 4ull * d, wrows},
      {"window values", layout.window_values_offset, 4ull * d, wrows},
  };
  std::uint64_t codes_total = 0, mismatched_records = 0;
  for (const RegionCount& r : regions) {
    if (r.record_bytes == 0) continue;
    std::uint64_t bad = 0;
    for (std::uint64_t i = 0; i < r.records; ++i) {
      if (std::memcmp(cpu + r.offset + i * r.record_bytes, gpu.data() + r.offset + i * r.record_bytes,
                      r.record_bytes) != 0) {
        ++bad;
      }
    }
    if (bad != 0) ADD_FAILURE() << r.name << ": " << bad << " of " << r.records << " records differ";
    mismatched_records += bad;
  }
  codes_total = slots * d * 2;
  std::printf("[encode] %s d=%u %s: %llu codes, %llu records differ\n", mode.c_str(), d,
              std::string(dtype_name(dtype)).c_str(), static_cast<unsigned long long>(codes_total),
              static_cast<unsigned long long>(mismatched_records));
  // A difference can only come from the float64 summation order of a norm (docs/cuda.md): at most one
  // per 10^6 codes, and in practice none.
  EXPECT_LE(mismatched_records * 1000000ull, codes_total);
}

TEST(CudaEncode, BytesEqualTheCpuCodecForEveryMode) {
  SKIP_WITHOUT_GPU();
  const char* const modes[] = {"k=prod2,v=mse2", "k=prod3,v=mse2",   "k=prod4,v=mse3",      "k=prod5,v=mse4",
                               "k=mse2,v=mse4",  "k=mse3,v=mse3,nc", "k=mse4,v=mse3,nc,w=8", "k=mse5,v=mse2,w=64"};
  const std::uint32_t dims[] = {64, 128, 256, 16, 80, 576};
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16};
  std::size_t i = 0;
  for (const char* mode : modes) {
    for (std::uint32_t d : dims) {
      check_encode(mode, d, dtypes[i % 3], fresh_seed());
      ++i;
    }
  }
}

TEST(CudaEncode, NonFiniteInputIsFlaggedAndZeroed) {
  SKIP_WITHOUT_GPU();
  const QuantConfig config = QuantConfig::seed_system(7);
  CacheShape shape;
  shape.head_dim = 64;
  shape.kv_heads = {1};
  shape.sequences = 1;
  shape.capacity = 4;
  auto cache = take(TurboQuantCache::create(shape, config));
  const auto& layout = *cache.layout(0);
  auto codec = take(DeviceCodec::create(*cache.codec(0)));
  auto layer = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  ASSERT_OK(layer.fill(0xAB));
  auto status = take(DeviceBuffer::allocate(4));
  ASSERT_OK(status.fill(0));
  std::vector<float> keys(64, 1.0f), values(64, 1.0f);
  keys[5] = std::numeric_limits<float>::quiet_NaN();
  auto dk = take(DeviceBuffer::allocate(256));
  auto dv = take(DeviceBuffer::allocate(256));
  ASSERT_OK(dk.upload(keys.data(), 256));
  ASSERT_OK(dv.upload(values.data(), 256));
  EncodeRequest req;
  req.rows = 1;
  req.keys = dk.data();
  req.values = dv.data();
  req.status = static_cast<std::uint32_t*>(status.data());
  ASSERT_OK(encode_append(layout, codec, layer.data(), req));
  ASSERT_OK(synchronize());
  std::uint32_t flags = 0;
  ASSERT_OK(status.download(&flags, 4));
  EXPECT_EQ(flags, kEncodeNonFinite);
  std::vector<std::uint8_t> codes(layout.token.key_codes, 0xFF);
  ASSERT_OK(layer.download(codes.data(), codes.size(), layout.key_codes_offset));
  for (std::uint8_t b : codes) EXPECT_EQ(b, 0);
  req.rows = 4;
  req.position = 1;
  EXPECT_EQ(encode_append(layout, codec, layer.data(), req).error().code, ErrorCode::CapacityExceeded);
}

struct DecodeCase {
  std::string mode;
  std::uint32_t d;
  std::uint32_t group;  // query heads per KV head
  bool sinks;
  std::uint32_t window;
  std::vector<std::uint32_t> lengths;
  int multiprocessors = 0;  // planned for this many (0: the device's); 1 makes 4-bit keys at d = 128 run narrow
  int expect_wide = -1;     // 0 / 1: the variant the plan must take (-1: not checked)
};

void check_decode(const DecodeCase& c, std::uint64_t seed) {
  SCOPED_TRACE("mode " + c.mode + " head_dim " + std::to_string(c.d) + " group " + std::to_string(c.group) +
               " sinks " + std::to_string(c.sinks) + " window " + std::to_string(c.window) + " seed " +
               std::to_string(seed));
  std::mt19937_64 rng(seed);
  QuantConfig config = parse_mode(c.mode, seed);
  config.exact_window = c.window;
  const std::uint32_t kv_heads = 2, q_heads = kv_heads * c.group, d = c.d;
  const auto seqs = static_cast<std::uint32_t>(c.lengths.size());
  std::uint32_t max_length = 0;
  for (std::uint32_t l : c.lengths) max_length = std::max(max_length, l);
  CacheShape shape;
  shape.head_dim = d;
  shape.kv_heads = {kv_heads};
  shape.sequences = seqs;
  shape.capacity = max_length + 3;  // deliberately not a multiple of 8 or 16
  auto cache = take(TurboQuantCache::create(shape, config));
  for (std::uint32_t seq = 0; seq < seqs; ++seq) {
    const std::uint32_t n = c.lengths[seq];
    if (n == 0) continue;
    const auto keys = random_rows(rng, std::size_t{n} * kv_heads, d, 1.0f, true);
    auto values = random_rows(rng, std::size_t{n} * kv_heads, d, 1.0f, false);
    // Value norms spanning a few decades exercise the per-tile norm scaling of P.
    std::uniform_real_distribution<float> decade(-1.5f, 1.5f);
    for (std::size_t r = 0; r < std::size_t{n} * kv_heads; ++r) {
      const float f = std::pow(10.0f, decade(rng));
      for (std::uint32_t j = 0; j < d; ++j) values[r * d + j] *= f;
    }
    ASSERT_OK(cache.append(0, seq, 0, n, DType::F32, keys.data(), values.data()));
  }
  const auto view = cache.view(0);
  const auto& layout = *view.layout;
  auto codec = take(DeviceCodec::create(*view.codec));
  auto layer = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  ASSERT_OK(layer.upload(view.data, layout.total_bytes));
  std::vector<std::uint32_t> lengths(view.lengths, view.lengths + seqs);
  std::vector<std::uint32_t> begins(view.window_begins, view.window_begins + seqs);
  auto dlen = take(DeviceBuffer::allocate(4ull * seqs));
  auto dbeg = take(DeviceBuffer::allocate(4ull * seqs));
  ASSERT_OK(dlen.upload(lengths.data(), 4ull * seqs));
  ASSERT_OK(dbeg.upload(begins.data(), 4ull * seqs));
  const auto queries = random_rows(rng, std::size_t{seqs} * q_heads, d, 1.0f, false);
  auto dq = take(DeviceBuffer::allocate(queries.size() * 4));
  ASSERT_OK(dq.upload(queries.data(), queries.size() * 4));
  std::vector<float> sinks(q_heads);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& s : sinks) s = normal(rng);
  auto dsinks = take(DeviceBuffer::allocate(4ull * q_heads));
  ASSERT_OK(dsinks.upload(sinks.data(), 4ull * q_heads));
  auto dout = take(DeviceBuffer::allocate(queries.size() * 4));
  ASSERT_OK(dout.fill(0xFF));  // NaN poison: every element must be written

  auto props = take(device_properties(0));
  auto plan = take(plan_decode(layout, config, q_heads, max_length,
                               c.multiprocessors != 0 ? c.multiprocessors : props.multiprocessors));
  if (c.expect_wide >= 0) {
    ASSERT_EQ(plan.wide, c.expect_wide == 1);
  }
  auto workspace = take(DeviceBuffer::allocate(plan.workspace_bytes));
  ASSERT_OK(workspace.fill(0xFF));
  DecodeArgs args;
  args.queries = static_cast<const float*>(dq.data());
  args.lengths = static_cast<const std::uint32_t*>(dlen.data());
  args.window_begins = static_cast<const std::uint32_t*>(dbeg.data());
  args.sinks = c.sinks ? static_cast<const float*>(dsinks.data()) : nullptr;
  args.output = static_cast<float*>(dout.data());
  ASSERT_OK(decode_attention(plan, codec, layer.data(), args, workspace.data()));
  ASSERT_OK(synchronize());
  std::vector<float> out(queries.size());
  ASSERT_OK(dout.download(out.data(), out.size() * 4));

  std::vector<AttentionRequest> requests;
  std::vector<std::uint32_t> request_seq;
  for (std::uint32_t seq = 0; seq < seqs; ++seq) {
    if (lengths[seq] == 0) continue;
    AttentionRequest req;
    req.seq = seq;
    req.first_position = lengths[seq] - 1;
    req.rows = 1;
    req.queries = queries.data() + std::size_t{seq} * q_heads * d;
    req.output = out.data();  // ignored by the oracle
    requests.push_back(req);
    request_seq.push_back(seq);
  }
  AttentionOptions options;
  options.q_heads = q_heads;
  options.sinks = c.sinks ? sinks.data() : nullptr;
  auto ref = take(kvcompact::tq::attention_oracle(view, requests, options));
  const std::size_t row = std::size_t{q_heads} * d;
  double worst = 0.0;
  for (std::size_t r = 0; r < requests.size(); ++r) {
    const std::uint32_t seq = request_seq[r];
    std::vector<float> got(out.begin() + seq * row, out.begin() + (seq + 1) * row);
    const double err = max_row_relative_error(got, ref[r], row);
    EXPECT_LE(err, 1e-3) << "sequence " << seq << " length " << lengths[seq];
    worst = std::isnan(err) ? err : std::max(worst, err);
  }
  std::printf("[decode] %s d=%u group=%u sinks=%d window=%u splits=%u wide=%d worst relative error %.3g\n",
              c.mode.c_str(), d, c.group, c.sinks ? 1 : 0, c.window, plan.splits, plan.wide ? 1 : 0, worst);
  for (std::uint32_t seq = 0; seq < seqs; ++seq) {
    if (lengths[seq] != 0) continue;
    for (std::size_t j = 0; j < row; ++j) ASSERT_EQ(out[seq * row + j], 0.0f) << "empty sequence " << seq;
  }
}

const std::vector<std::uint32_t> kAwkward = {1, 7, 127, 128, 129, 600};

TEST(CudaDecode, MatchesTheFloat64OracleAcrossModesAndShapes) {
  SKIP_WITHOUT_GPU();
  const std::vector<DecodeCase> cases = {
      {"k=prod3,v=mse2", 128, 4, false, 0, kAwkward},
      {"k=prod3,v=mse2", 128, 4, true, 0, kAwkward},
      {"k=mse4,v=mse3,nc", 128, 4, false, 0, kAwkward, 0, 1},
      {"k=mse4,v=mse3,nc", 128, 8, true, 32, kAwkward},
      {"k=prod3,v=mse2", 64, 1, false, 16, kAwkward},
      {"k=prod3,v=mse2", 256, 8, true, 0, kAwkward},
      {"k=prod2,v=mse3", 64, 4, true, 0, kAwkward},
      {"k=prod4,v=mse4", 128, 1, false, 0, kAwkward},
      {"k=prod5,v=mse4", 256, 4, false, 128, kAwkward},
      {"k=mse5,v=mse2", 128, 16, true, 0, kAwkward},
      {"k=mse3,v=mse3,nc", 256, 1, false, 7, kAwkward},
      {"k=mse2,v=mse4", 64, 8, false, 0, kAwkward},
      // 5-bit keys at d = 64: 10-byte key slices, read as three aligned words (load_slice's unaligned form).
      {"k=mse5,v=mse3,nc", 64, 4, true, 0, kAwkward},
      {"k=prod3,v=mse2", 128, 4, true, 64, {0, 5000, 4099, 2, 1777}},
      {"k=mse4,v=mse3,nc", 128, 4, false, 0, {3000, 64, 65, 0}},
      // Groups of 2 and 3 heads: the packed kernel (hi / lo halves in the MMA's N columns) with empty columns.
      {"k=mse4,v=mse3,nc", 128, 3, true, 0, kAwkward},
      {"k=prod3,v=mse2", 128, 2, false, 16, kAwkward},
      // 4-bit keys at d = 128 run the wide variant when every block fits in one wave (the mse4 cases above) and
      // the narrow kernel otherwise: planned for one multiprocessor, these take several waves.
      {"k=mse4,v=mse3,nc", 128, 4, true, 0, kAwkward, 1, 0},
      {"k=mse4,v=mse3,nc", 128, 8, false, 0, {3000, 64, 65, 0}, 1, 0},
      {"k=prod5,v=mse3", 128, 4, false, 0, kAwkward, 0, 0},  // QJL keys: narrow only
  };
  for (const DecodeCase& c : cases) check_decode(c, fresh_seed());
}

// Argument checks happen before any CUDA call, so this runs without a device too.
TEST(CudaDecode, UnsupportedShapesAreTypedErrors) {
  const QuantConfig config = QuantConfig::seed_system();
  auto layout = take(kvcompact::tq::plan_layer_layout(80, 2, 1, 64, config));
  EXPECT_EQ(plan_decode(layout, config, 4, 64, 132).error().code, ErrorCode::Unsupported);
  auto layout128 = take(kvcompact::tq::plan_layer_layout(128, 2, 1, 64, config));
  EXPECT_EQ(plan_decode(layout128, config, 3, 64, 132).error().code, ErrorCode::InvalidArgument);
  EXPECT_EQ(plan_decode(layout128, config, 4, 65, 132).error().code, ErrorCode::OutOfRange);
  // Beyond the grid's y / z limit (65535): more sequences, or more KV heads x head groups, than one launch holds.
  auto grid_error = [](const auto& planned) {
    return !planned.ok() && planned.error().code == ErrorCode::OutOfRange &&
           planned.error().message.find("decode grid") != std::string::npos;
  };
  auto many_sequences = take(kvcompact::tq::plan_layer_layout(64, 1, 70000, 16, config));
  EXPECT_TRUE(grid_error(plan_decode(many_sequences, config, 1, 16, 132)));
  auto many_heads = take(kvcompact::tq::plan_layer_layout(64, 70000, 1, 16, config));
  EXPECT_TRUE(grid_error(plan_decode(many_heads, config, 70000, 16, 132)));
}

// A one-layer CPU cache of random sequences, its device codec and layer copy, the lengths and random queries (also
// kept on the host): the inputs of the decode tests that compare calls with each other.
struct DecodeInputs {
  kvcompact::tq::TurboQuantCache cache;
  DeviceCodec codec;
  DeviceBuffer layer, lengths, queries;
  std::vector<float> q;
};

DecodeInputs decode_inputs(std::mt19937_64& rng, const QuantConfig& config, std::uint32_t d, std::uint32_t kv_heads,
                           std::uint32_t q_heads, const std::vector<std::uint32_t>& lengths, std::uint32_t capacity) {
  auto cache = testing::random_cpu_cache(rng, config, d, kv_heads, lengths, capacity);
  auto codec = take(DeviceCodec::create(*cache.view(0).codec));
  auto layer = testing::upload_layer(cache.view(0));
  auto dlen = take(DeviceBuffer::allocate(4ull * lengths.size()));
  EXPECT_OK(dlen.upload(lengths.data(), 4ull * lengths.size()));
  auto q = random_rows(rng, lengths.size() * q_heads, d, 1.0f, false);
  auto dq = take(DeviceBuffer::allocate(q.size() * 4));
  EXPECT_OK(dq.upload(q.data(), q.size() * 4));
  return DecodeInputs{std::move(cache), std::move(codec), std::move(layer), std::move(dlen), std::move(dq), std::move(q)};
}

// Plans are plain structs: decode_attention re-checks a plan's fields (decode_plan_check.hpp) and refuses hand
// edits that would make its kernels read past the layer, write past the workspace or leave tokens out, with
// InvalidArgument and before any launch (the output keeps its bytes). DecodePlanCheck.* covers every field on the
// CPU; this runs the edits through the entry point.
TEST(CudaDecode, EditedPlansAreTypedErrors) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto props = take(device_properties(0));
  for (const QuantConfig& config : {QuantConfig::recommended(seed), QuantConfig::seed_system(seed)}) {
    const std::uint32_t q_heads = 8, capacity = 1300;
    DecodeInputs in = decode_inputs(rng, config, 128, 2, q_heads, {700, 1, 1300}, capacity);
    const auto view = in.cache.view(0);
    auto out = take(DeviceBuffer::allocate(in.q.size() * 4));
    const DecodePlan plan = take(plan_decode(*view.layout, config, q_heads, capacity, props.multiprocessors));
    auto ws = take(DeviceBuffer::allocate(plan.workspace_bytes));
    DecodeArgs args;
    args.queries = static_cast<const float*>(in.queries.data());
    args.lengths = static_cast<const std::uint32_t*>(in.lengths.data());
    args.output = static_cast<float*>(out.data());
    ASSERT_OK(decode_attention(plan, in.codec, in.layer.data(), args, ws.data()));
    ASSERT_OK(synchronize());
    ASSERT_OK(out.fill(0xA5));
    auto refused = [&](const DecodePlan& edited, const char* field) {
      EXPECT_TRUE(testing::refused_naming(decode_attention(edited, in.codec, in.layer.data(), args, ws.data()), field));
    };
    DecodePlan e = plan;
    e.max_length = capacity + 1;
    refused(e, "max_length");
    e = plan;
    e.splits = plan.splits + 1;  // the workspace was sized for the plan's splits
    refused(e, "workspace_bytes");
    e = plan;
    e.chunk = 0;
    refused(e, "chunk");
    e = plan;
    e.splits = 0;
    refused(e, "splits");
    e = plan;
    e.workspace_bytes = plan.workspace_bytes - 1;
    refused(e, "workspace_bytes");
    if (!detail::decode_has_wide(128, config.key_code_bits(), config.has_qjl())) {
      e = plan;
      e.wide = true;
      refused(e, "wide");
    }
    ASSERT_OK(synchronize());
    std::vector<std::uint8_t> bytes(in.q.size() * 4);
    ASSERT_OK(out.download(bytes.data(), bytes.size()));
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), std::uint8_t{0xA5}), static_cast<std::ptrdiff_t>(bytes.size()))
        << "a refused call wrote output";
  }
}

// plan / run: decode_attention allocates nothing and synchronises nothing, so it can be captured in a CUDA
// graph; the replayed graph must give the same output as a direct call (bit for bit: same kernels, same data).
TEST(CudaDecode, RunIsCapturableInACudaGraph) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = QuantConfig::seed_system(seed);
  const std::uint32_t q_heads = 8;
  DecodeInputs in = decode_inputs(rng, config, 128, 2, q_heads, {700, 1, 1300}, 1300);
  const auto view = in.cache.view(0);
  const auto& q = in.q;
  auto direct = take(DeviceBuffer::allocate(q.size() * 4));
  auto graphed = take(DeviceBuffer::allocate(q.size() * 4));
  ASSERT_OK(graphed.fill(0xFF));
  auto props = take(device_properties(0));
  auto plan = take(plan_decode(*view.layout, config, q_heads, 1300, props.multiprocessors));
  auto ws = take(DeviceBuffer::allocate(plan.workspace_bytes));
  DecodeArgs args;
  args.queries = static_cast<const float*>(in.queries.data());
  args.lengths = static_cast<const std::uint32_t*>(in.lengths.data());
  args.output = static_cast<float*>(direct.data());
  ASSERT_OK(decode_attention(plan, in.codec, in.layer.data(), args, ws.data()));
  ASSERT_OK(synchronize());

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  args.output = static_cast<float*>(graphed.data());
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status captured = decode_attention(plan, in.codec, in.layer.data(), args, ws.data(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_OK(captured);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> a(q.size()), b(q.size());
  ASSERT_OK(direct.download(a.data(), a.size() * 4));
  ASSERT_OK(graphed.download(b.data(), b.size() * 4));
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  EXPECT_FALSE(std::isnan(b[0]));
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
}

// Without an exact window the fused kernel merges the splits itself, counting arrivals in tagged words of the
// workspace (decode_merge.cuh, merge_if_last). A workspace with arbitrary bytes, shared by two plans of different
// split counts in turn, must give every call the output of a call on a workspace of its own, bit for bit.
TEST(CudaDecode, WorkspaceNeedsNoInitialisationAndIsSharedByPlans) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const QuantConfig config = QuantConfig::recommended(seed);
  const std::uint32_t d = 128, q_heads = 8;
  DecodeInputs in = decode_inputs(rng, config, d, 2, q_heads, {2900, 0, 1700}, 3000);
  const auto view = in.cache.view(0);
  const auto& q = in.q;
  auto props = take(device_properties(0));
  // Many splits (the whole capacity over every multiprocessor: 6 on the H200) and fewer but more than one (as if
  // on a smaller device: the first of these multiprocessor counts whose plan has them).
  auto many = take(plan_decode(*view.layout, config, q_heads, 3000, props.multiprocessors));
  DecodePlan few;
  for (const int sms : {8, 16, 24, 32, 48, 64}) {
    few = take(plan_decode(*view.layout, config, q_heads, 3000, sms));
    if (few.splits > 1 && few.splits != many.splits) break;
  }
  ASSERT_NE(many.splits, few.splits);
  ASSERT_GT(few.splits, 1u);
  auto run = [&](const DecodePlan& plan, void* workspace) {
    auto out = take(DeviceBuffer::allocate(q.size() * 4));
    EXPECT_OK(out.fill(0xFF));
    DecodeArgs args;
    args.queries = static_cast<const float*>(in.queries.data());
    args.lengths = static_cast<const std::uint32_t*>(in.lengths.data());
    args.output = static_cast<float*>(out.data());
    EXPECT_OK(decode_attention(plan, in.codec, in.layer.data(), args, workspace));
    EXPECT_OK(synchronize());
    std::vector<float> host(q.size());
    EXPECT_OK(out.download(host.data(), host.size() * 4));
    return host;
  };
  auto own_many = take(DeviceBuffer::allocate(many.workspace_bytes));
  auto own_few = take(DeviceBuffer::allocate(few.workspace_bytes));
  const auto ref_many = run(many, own_many.data());
  const auto ref_few = run(few, own_few.data());
  std::vector<std::uint8_t> garbage(std::max(many.workspace_bytes, few.workspace_bytes));
  for (auto& b : garbage) b = static_cast<std::uint8_t>(rng());
  auto shared = take(DeviceBuffer::allocate(garbage.size()));
  ASSERT_OK(shared.upload(garbage.data(), garbage.size()));
  const std::size_t bytes = q.size() * 4;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::memcmp(run(many, shared.data()).data(), ref_many.data(), bytes), 0) << "round " << i << ", many";
    EXPECT_EQ(std::memcmp(run(few, shared.data()).data(), ref_few.data(), bytes), 0) << "round " << i << ", few";
  }
  EXPECT_FALSE(std::isnan(ref_many[0]));
  for (std::size_t j = 0; j < std::size_t{q_heads} * d; ++j) ASSERT_EQ(ref_few[q_heads * d + j], 0.0f);
}

// A small encode + decode pair for compute-sanitizer (memcheck / racecheck), run by scripts/gpu/run_all.sh.
TEST(CudaSmall, EncodeAndDecodeForSanitizers) {
  SKIP_WITHOUT_GPU();
  check_encode("k=prod3,v=mse2,w=16", 128, DType::BF16, fresh_seed());
  check_decode({"k=prod3,v=mse2", 128, 4, true, 16, {1, 7, 129, 300}}, fresh_seed());
  check_decode({"k=mse4,v=mse3,nc", 64, 8, false, 0, {65, 0, 200}}, fresh_seed());
  check_decode({"k=mse4,v=mse3,nc", 128, 4, true, 0, {65, 0, 700}, 0, 1}, fresh_seed());  // the wide variant
}

// cudaDeviceReset destroys the device's primary context with every kernel attribute set in it. The TurboQuant
// launchers set theirs per codec and plan, so codecs and plans made after a reset (the old ones belong to the
// destroyed context) encode and decode as before; the fast encode kernel's remembered resident-block count is a
// property of the kernel and device and stays right. This binary keeps no device memory across tests.
TEST(CudaDeviceReset, NewCodecsAndPlansWorkAfterAReset) {
  SKIP_WITHOUT_GPU();
  for (const char* when : {"before", "after"}) {
    SCOPED_TRACE(std::string(when) + " the reset");
    check_encode("k=mse4,v=mse3,nc", 128, DType::BF16, fresh_seed());  // the fast kernel
    check_decode({"k=mse4,v=mse3,nc", 128, 4, true, 0, {65, 0, 700}, 0, 1}, fresh_seed());  // the wide variant
    check_decode({"k=prod3,v=mse2", 128, 4, true, 16, {1, 7, 129, 300}}, fresh_seed());
    if (std::string(when) == "before") {
      ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
    }
  }
}

// The plan takes the wide variant (4-bit keys, d = 128, mse modes) exactly when its blocks and the narrow kernel's
// both fit in one wave.
TEST(CudaDecode, PlanTakesTheWideVariantInOneWave) {
  SKIP_WITHOUT_GPU();
  auto props = take(device_properties(0));
  auto plan = [&](const QuantConfig& config, std::uint32_t d, std::uint32_t sequences, std::uint32_t length) {
    auto layout = take(kvcompact::tq::plan_layer_layout(d, 8, sequences, length, config));
    return take(plan_decode(layout, config, 32, length, props.multiprocessors));
  };
  const QuantConfig recommended = QuantConfig::recommended(1), seed_mode = QuantConfig::seed_system();
  EXPECT_TRUE(plan(recommended, 128, 1, 32768).wide);     // 8 KV heads: one wave of splits
  EXPECT_TRUE(plan(recommended, 128, 8, 32768).wide);
  EXPECT_FALSE(plan(recommended, 128, 64, 131072).wide);  // 512 (sequence, KV head) blocks: more than a wave
  // 256 blocks: one wave of the narrow kernel (two per multiprocessor on the H200), two of the wide one.
  EXPECT_FALSE(plan(recommended, 128, 32, 4096).wide);
  EXPECT_FALSE(plan(recommended, 64, 1, 32768).wide);     // no wide variant at d = 64
  EXPECT_FALSE(plan(seed_mode, 128, 1, 32768).wide);      // nor for 2-bit keys
  const QuantConfig prod5 = parse_mode("k=prod5,v=mse3", 1);
  EXPECT_FALSE(plan(prod5, 128, 1, 32768).wide);          // nor for QJL keys
}

}  // namespace
}  // namespace kvcompact::cuda::tq
