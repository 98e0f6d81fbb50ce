// The fast CUDA encode kernel (head_dim 64 / 128 / 256) against LayerCodec::encode_key / encode_value byte by
// byte: every key / value mode and norm correction × head_dim × f32 / bf16 / f16, large batches, adversarial
// rows (coordinates rotated exactly onto a quantiser boundary, zeros, one-hot, tiny / subnormal / huge
// magnitudes, NaN / inf and norm overflow mixed with good rows), appends at unaligned positions and the exact
// window ring. The oracle writes the whole expected layer (bad rows: a zero record and a status bit); device
// and host layers start from the same poison bytes, so stray writes show up too.
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

#include "cuda/encode_params.hpp"
#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/cuda/runtime.hpp"
#include "kvcompact/cuda/tq.hpp"
#include "kvcompact/tq/codebook.hpp"
#include "kvcompact/tq/codec.hpp"
#include "kvcompact/tq/layout.hpp"
#include "kvcompact/tq/normalise.hpp"
#include "kvcompact/tq/rotation.hpp"
#include "unit/tq/attention_test_util.hpp"
#include "cuda/cuda_test_util.hpp"

namespace kvcompact::cuda::tq {
namespace {

using kvcompact::cuda::testing::take;
using kvcompact::cuda::testing::to_dtype;

using kvcompact::tq::KeyRecord;
using kvcompact::tq::QuantConfig;
using kvcompact::tq::ValueRecord;
using kvcompact::tq::testing::fresh_seed;

// Row generators. Each append mixes these kinds row by row, so one warp step sees good and bad rows together.
enum class RowKind {
  Gaussian,     // N(0, σ) with outlier channels
  Zero,         // all zero: zero record, no flag
  HalfZero,     // every other coordinate exactly 0
  OneHot,       // a single nonzero coordinate
  Tiny,         // f32 / bf16: scaled by 1e-30 or, for half of them, 1e-38 (norm below 2^-120: the codec's float64
                // division, normalise.hpp); f16: smallest normals
  Subnormal,    // subnormal coordinates mixed with normal ones (tiny, subnormal products)
  Huge,         // f32 / bf16: scaled by 1e30 or, for half of them, 1e37 (norm beyond 2^120: the float64 division)
  Overflow,     // norm beyond float32: zero record + kEncodeNormOverflow
  NcOverflow,   // f32 / bf16: one coordinate ±3.3895e38 (bf16's largest): ‖x‖ fits float32 but, with norm correction,
                // ‖x‖ / ‖c‖ (‖c‖ < 1) does not: zero record + kEncodeNormOverflow; f16: ±65504 (a valid row)
  NaN,          // one NaN coordinate: zero record + kEncodeNonFinite
  Inf,          // one inf coordinate: zero record + kEncodeNonFinite
  Tie,          // f32 only: a rotated coordinate exactly on a quantiser boundary
};

const char* kind_name(RowKind k) {
  switch (k) {
    case RowKind::Gaussian: return "gaussian";
    case RowKind::Zero: return "zero";
    case RowKind::HalfZero: return "half-zero";
    case RowKind::OneHot: return "one-hot";
    case RowKind::Tiny: return "tiny";
    case RowKind::Subnormal: return "subnormal";
    case RowKind::Huge: return "huge";
    case RowKind::Overflow: return "overflow";
    case RowKind::NcOverflow: return "nc-overflow";
    case RowKind::NaN: return "nan";
    case RowKind::Inf: return "inf";
    case RowKind::Tie: return "tie";
  }
  return "?";
}

float round_to(float v, DType dtype) {
  if (dtype == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if (dtype == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// Nudges a random f32 row until one coordinate of R·(x/‖x‖), computed exactly as the CPU encoder does,
// equals a boundary of `boundaries` (the quantiser's tie: it must go to the upper cell on both sides).
bool make_tie_row(std::vector<float>& x, const kvcompact::tq::Rotation& rotation, std::span<const float> boundaries,
                  std::mt19937_64& rng) {
  const std::uint32_t d = static_cast<std::uint32_t>(x.size());
  std::vector<float> u(d), y(d);
  std::uniform_int_distribution<std::uint32_t> pick_j(0, d - 1);
  std::uniform_int_distribution<std::size_t> pick_b(0, boundaries.size() - 1);
  const std::uint32_t j = pick_j(rng);
  const float target = boundaries[pick_b(rng)];
  for (int iter = 0; iter < 4000; ++iter) {
    double s = 0.0;
    for (float v : x) s += static_cast<double>(v) * v;
    const double n = std::sqrt(s);
    const float r = kvcompact::tq::unit_reciprocal(n);  // the codec's normalisation (normalise.hpp); n is in range
    for (std::uint32_t i = 0; i < d; ++i) u[i] = kvcompact::tq::unit_coordinate(x[i], r);
    rotation.forward(u, y);
    if (y[j] == target) return true;
    const double gap = static_cast<double>(target) - y[j];
    if (std::fabs(gap) > 64.0 * std::fabs(std::nextafter(y[j], 2.0f) - y[j]) + 1e-30) {
      // Far: a linear step along row j of R.
      for (std::uint32_t i = 0; i < d; ++i) x[i] = static_cast<float>(x[i] + gap * n * rotation.matrix_entry(j, i));
    } else {
      // Near: one ulp of one coordinate moves y_j by a fraction of its ulp; walk towards the target.
      const std::uint32_t i = pick_j(rng);
      const bool up = (rotation.matrix_entry(j, i) > 0) == (gap > 0);
      x[i] = std::nextafter(x[i], up ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity());
    }
  }
  return false;
}

struct Generator {
  std::mt19937_64 rng;
  DType dtype;
  std::uint32_t d;
  const kvcompact::tq::LayerCodec* codec;
  std::uint32_t ties_wanted = 0, ties_made = 0;

  std::vector<float> row(RowKind kind, bool value) {
    std::normal_distribution<float> normal(0.0f, value ? 0.5f : 1.0f);
    std::vector<float> x(d);
    for (std::uint32_t j = 0; j < d; ++j) {
      x[j] = normal(rng);
      if (!value && (j == 3 || j == d / 2 + 1)) x[j] *= 8.0f;
    }
    std::uniform_int_distribution<std::uint32_t> pick(0, d - 1);
    std::bernoulli_distribution coin(0.5);
    const float f16_min_normal = 6.103515625e-05f;
    switch (kind) {
      case RowKind::Gaussian: break;
      case RowKind::Zero: std::fill(x.begin(), x.end(), 0.0f); break;
      case RowKind::HalfZero:
        for (std::uint32_t j = 0; j < d; j += 2) x[j] = 0.0f;
        break;
      case RowKind::OneHot: {
        const std::uint32_t at = pick(rng);
        const float v = x[at];
        std::fill(x.begin(), x.end(), 0.0f);
        x[at] = v;
        break;
      }
      case RowKind::Tiny: {
        const float scale = dtype == DType::F16 ? f16_min_normal : coin(rng) ? 1e-38f : 1e-30f;
        for (float& v : x) v *= scale;
        break;
      }
      case RowKind::Subnormal:
        // A few coordinates far below the others: their products x_j · RN32(1/‖x‖) are subnormal.
        for (std::uint32_t k = 0; k < 4; ++k) {
          const std::uint32_t at = pick(rng);
          x[at] = dtype == DType::F16 ? 6e-8f * static_cast<float>(k + 1)
                  : dtype == DType::BF16 ? 1e-39f * static_cast<float>(k + 1)
                                          : 1e-42f * static_cast<float>(k + 1);
        }
        break;
      case RowKind::Huge:
        if (dtype != DType::F16) {
          const float scale = coin(rng) ? 1e37f : 1e30f;
          for (float& v : x) v = std::clamp(v * scale, -3e38f, 3e38f);
        } else {
          for (float& v : x) v = std::clamp(v * 8000.0f, -65504.0f, 65504.0f);
        }
        break;
      case RowKind::Overflow:
        if (dtype != DType::F16) {
          for (float& v : x) v = (v >= 0 ? 1.0f : -1.0f) * 3.0e38f;
        } else {
          for (float& v : x) v = (v >= 0 ? 1.0f : -1.0f) * 65504.0f;  // cannot overflow: a valid row
        }
        break;
      case RowKind::NcOverflow: {
        const float v = (coin(rng) ? 1.0f : -1.0f) * (dtype == DType::F16 ? 65504.0f : 3.3895313892515355e38f);
        std::fill(x.begin(), x.end(), 0.0f);
        x[pick(rng)] = v;
        break;
      }
      case RowKind::NaN: x[pick(rng)] = std::numeric_limits<float>::quiet_NaN(); break;
      case RowKind::Inf: x[pick(rng)] = -std::numeric_limits<float>::infinity(); break;
      case RowKind::Tie:
        if (dtype == DType::F32) {
          ++ties_wanted;
          const auto& book = value ? codec->value_codebook() : codec->key_codebook();
          if (make_tie_row(x, codec->main_rotation(), book.boundaries_f32(), rng)) ++ties_made;
        }
        break;
    }
    for (float& v : x) v = round_to(v, dtype);
    return x;
  }
};

struct Append {
  std::uint32_t seq, position, rows;
};

struct Case {
  std::string mode;       // QuantConfig::parse text
  std::uint32_t d = 128;
  DType dtype = DType::BF16;
  std::uint32_t kv_heads = 3;
  std::uint32_t sequences = 2;
  std::uint32_t capacity = 301;
  std::vector<Append> appends;
  std::vector<RowKind> kinds = {RowKind::Gaussian};  // row r of an append uses kinds[r % size]
  const char* label = "";
  bool misalign_input = false;  // input pointers 16-byte misaligned: the general kernel
};

// The CPU oracle of one append: LayerCodec records (zeros and a status bit for rows it rejects) and the ring.
std::uint32_t cpu_append(const kvcompact::tq::LayerCodec& codec, const kvcompact::tq::LayerLayout& layout,
                         std::vector<std::uint8_t>& layer, const Append& a, const std::vector<float>& keys,
                         const std::vector<float>& values) {
  const std::uint32_t d = layout.head_dim, H = layout.kv_heads;
  std::vector<float> scratch(2 * d);
  std::uint32_t status = 0;
  auto flag_of = [](const Status& s) -> std::uint32_t {
    if (s.ok()) return 0;
    return s.error().code == ErrorCode::NonFinite ? kEncodeNonFinite : kEncodeNormOverflow;
  };
  for (std::uint32_t row = 0; row < a.rows; ++row) {
    for (std::uint32_t head = 0; head < H; ++head) {
      const std::uint64_t slot = layout.slot(a.seq, head, a.position + row);
      const float* k = keys.data() + (static_cast<std::size_t>(row) * H + head) * d;
      const float* v = values.data() + (static_cast<std::size_t>(row) * H + head) * d;
      KeyRecord kr;
      kr.codes = layer.data() + layout.key_codes_offset + slot * layout.token.key_codes;
      kr.signs = layout.token.key_signs ? layer.data() + layout.key_signs_offset + slot * layout.token.key_signs : nullptr;
      kr.norm = reinterpret_cast<float*>(layer.data() + layout.key_norms_offset) + slot;
      kr.residual_norm = layout.token.key_residual_norm
                             ? reinterpret_cast<std::uint16_t*>(layer.data() + layout.key_residual_norms_offset) + slot
                             : nullptr;
      const Status ks = codec.encode_key({k, d}, kr, scratch);
      if (!ks.ok()) {
        std::memset(kr.codes, 0, layout.token.key_codes);
        if (kr.signs) std::memset(kr.signs, 0, layout.token.key_signs);
        if (kr.residual_norm) *kr.residual_norm = 0;
        *kr.norm = 0.0f;
      }
      ValueRecord vr;
      vr.codes = layer.data() + layout.value_codes_offset + slot * layout.token.value_codes;
      vr.norm = reinterpret_cast<float*>(layer.data() + layout.value_norms_offset) + slot;
      const Status vs = codec.encode_value({v, d}, vr, scratch);
      if (!vs.ok()) {
        std::memset(vr.codes, 0, layout.token.value_codes);
        *vr.norm = 0.0f;
      }
      status |= flag_of(ks) | flag_of(vs);
    }
  }
  const std::uint32_t w = layout.exact_window;
  if (w > 0) {
    for (std::uint32_t row = a.rows > w ? a.rows - w : 0; row < a.rows; ++row) {
      for (std::uint32_t head = 0; head < H; ++head) {
        const std::uint64_t ring = layout.window_row(a.seq, head, a.position + row) * d * 4;
        const std::size_t src = (static_cast<std::size_t>(row) * H + head) * d;
        std::memcpy(layer.data() + layout.window_keys_offset + ring, keys.data() + src, 4ull * d);
        std::memcpy(layer.data() + layout.window_values_offset + ring, values.data() + src, 4ull * d);
      }
    }
  }
  return status;
}

struct Outcome {
  std::uint64_t records = 0, differ = 0, codes = 0;
  std::uint32_t status = 0;  // the CPU oracle's status bits (the GPU's are checked equal)
};

// Runs one case on the GPU and the CPU; compares every region record by record.
Outcome run_case(const Case& c, std::uint64_t seed) {
  Outcome out;
  SCOPED_TRACE(std::string(c.label) + " mode " + c.mode + " head_dim " + std::to_string(c.d) + " dtype " +
               std::string(dtype_name(c.dtype)) + " seed " + std::to_string(seed));
  auto parsed = QuantConfig::parse(c.mode, seed);
  EXPECT_TRUE(parsed.ok()) << c.mode;
  if (!parsed.ok()) return out;
  const QuantConfig config = *parsed;
  auto codec = take(kvcompact::tq::LayerCodec::create(c.d, config, 5));
  const auto layout = take(kvcompact::tq::plan_layer_layout(c.d, c.kv_heads, c.sequences, c.capacity, config));
  auto dcodec = take(DeviceCodec::create(codec));
  auto layer = take(DeviceBuffer::allocate(layer_buffer_bytes(layout)));
  EXPECT_TRUE(layer.fill(0xCD).ok());
  std::vector<std::uint8_t> expected(layout.total_bytes, 0xCD);
  auto status = take(DeviceBuffer::allocate(4));
  EXPECT_TRUE(status.fill(0).ok());
  std::uint32_t expected_status = 0;
  Generator gen{std::mt19937_64(seed), c.dtype, c.d, &codec};
  bool fast = false;
  for (const Append& a : c.appends) {
    std::vector<float> keys, values;
    keys.reserve(std::size_t{a.rows} * c.kv_heads * c.d);
    values.reserve(keys.capacity());
    for (std::uint32_t r = 0; r < a.rows; ++r) {
      for (std::uint32_t h = 0; h < c.kv_heads; ++h) {
        const RowKind kind = c.kinds[(r * c.kv_heads + h) % c.kinds.size()];
        const auto k = gen.row(kind, false);
        const RowKind vkind = c.kinds[(r * c.kv_heads + h + 1) % c.kinds.size()];
        const auto v = gen.row(vkind, true);
        keys.insert(keys.end(), k.begin(), k.end());
        values.insert(values.end(), v.begin(), v.end());
      }
    }
    expected_status |= cpu_append(codec, layout, expected, a, keys, values);
    const auto kb = to_dtype(keys, c.dtype), vb = to_dtype(values, c.dtype);
    const std::size_t shift = c.misalign_input ? 4 : 0;  // 4 bytes: still element-aligned for every dtype
    auto dk = take(DeviceBuffer::allocate(kb.size() + 16));
    auto dv = take(DeviceBuffer::allocate(vb.size() + 16));
    EXPECT_TRUE(dk.upload(kb.data(), kb.size(), shift).ok());
    EXPECT_TRUE(dv.upload(vb.data(), vb.size(), shift).ok());
    EncodeRequest req;
    req.seq = a.seq;
    req.position = a.position;
    req.rows = a.rows;
    req.dtype = c.dtype;
    req.keys = static_cast<const std::uint8_t*>(dk.data()) + shift;
    req.values = static_cast<const std::uint8_t*>(dv.data()) + shift;
    req.status = static_cast<std::uint32_t*>(status.data());
    detail::EncodeParams probe{};
    probe.layer = static_cast<std::uint8_t*>(layer.data());
    probe.keys = req.keys;
    probe.values = req.values;
    probe.head_dim = c.d;
    probe.kv_heads = c.kv_heads;
    probe.rows = a.rows;
    probe.key_code_bits = config.key_code_bits();
    probe.value_bits = config.value_bits;
    probe.dtype = c.dtype == DType::F32 ? 0 : c.dtype == DType::F16 ? 1 : 2;
    fast = detail::encode_path(probe) == detail::EncodePath::Fast;
    // The case takes the path its label says (the fast kernel for d = 64 / 128 / 256 from aligned inputs): a
    // dispatch that sent everything to the general kernel would otherwise pass the fast kernel's tests.
    EXPECT_EQ(fast, (c.d == 64 || c.d == 128 || c.d == 256) && !c.misalign_input) << "encode path";
    const Status s = encode_append(layout, dcodec, layer.data(), req);
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    EXPECT_TRUE(synchronize().ok());
  }
  std::uint32_t flags = 0xFFFFFFFFu;
  EXPECT_TRUE(status.download(&flags, 4).ok());
  EXPECT_EQ(flags, expected_status) << "status word";
  out.status = expected_status;
  std::vector<std::uint8_t> gpu(layout.total_bytes);
  EXPECT_TRUE(layer.download(gpu.data(), gpu.size()).ok());
  const std::uint64_t slots = std::uint64_t{layout.sequences} * layout.kv_heads * layout.capacity;
  const std::uint64_t wrows = std::uint64_t{layout.sequences} * layout.kv_heads * layout.exact_window;
  struct Region {
    const char* name;
    std::uint64_t offset, record_bytes, records;
  };
  const Region regions[] = {
      {"key codes", layout.key_codes_offset, layout.token.key_codes, slots},
      {"key signs", layout.key_signs_offset, layout.token.key_signs, slots},
      {"key norms", layout.key_norms_offset, 4, slots},
      {"key residual norms", layout.key_residual_norms_offset, layout.token.key_residual_norm, slots},
      {"value codes", layout.value_codes_offset, layout.token.value_codes, slots},
      {"value norms", layout.value_norms_offset, 4, slots},
      {"window keys", layout.window_keys_offset, 4ull * c.d, wrows},
      {"window values", layout.window_values_offset, 4ull * c.d, wrows},
  };
  std::string detail_text;
  for (const Region& r : regions) {
    if (r.record_bytes == 0) continue;
    std::uint64_t bad = 0, first = 0;
    for (std::uint64_t i = 0; i < r.records; ++i) {
      if (std::memcmp(expected.data() + r.offset + i * r.record_bytes, gpu.data() + r.offset + i * r.record_bytes,
                      r.record_bytes) != 0) {
        if (bad == 0) first = i;
        ++bad;
      }
    }
    out.records += r.records;
    out.differ += bad;
    if (bad != 0) {
      detail_text += std::string(" ") + r.name + ":" + std::to_string(bad) + "(first " + std::to_string(first) + ")";
      ADD_FAILURE() << r.name << ": " << bad << " of " << r.records << " records differ, first at record " << first;
    }
  }
  // Bytes between and after the regions (alignment padding) must be untouched.
  out.codes = slots * c.d * 2;
  std::printf("[encode-fast] %s %s d=%u %s path=%s: %llu records, %llu differ%s%s\n", c.label, c.mode.c_str(), c.d,
              std::string(dtype_name(c.dtype)).c_str(), fast ? "fast" : "general",
              static_cast<unsigned long long>(out.records), static_cast<unsigned long long>(out.differ),
              gen.ties_wanted ? (" ties " + std::to_string(gen.ties_made) + "/" + std::to_string(gen.ties_wanted)).c_str() : "",
              detail_text.c_str());
  if (gen.ties_wanted > 0) {
    EXPECT_GE(gen.ties_made * 2, gen.ties_wanted) << "the tie construction failed too often";
  }
  // docs/cuda.md: a float64 norm summed in another order can change a byte only with probability ≈ 2⁻²⁹ per
  // value; the bound below is the existing encode test's (one per 10⁶ codes), and in practice it is 0.
  EXPECT_LE(out.differ * 1000000ull, out.codes) << "differing records";
  return out;
}

const char* const kKeyModes[] = {"k=mse2", "k=mse3", "k=mse4", "k=mse5", "k=prod2", "k=prod3", "k=prod4", "k=prod5"};
const char* const kValueModes[] = {"v=mse2", "v=mse3", "v=mse4"};
const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};
const std::uint32_t kDims[] = {64, 128, 256};

TEST(CudaEncodeFast, EveryModeDimAndDtype) {
  SKIP_WITHOUT_GPU();
  std::size_t i = 0;
  for (const char* k : kKeyModes) {
    for (std::uint32_t d : kDims) {
      for (DType dtype : kDtypes) {
        Case c;
        c.mode = std::string(k) + "," + kValueModes[i % 3];
        if (k[2] == 'm' && (i / 3) % 2 == 0) c.mode += ",nc";  // norm correction on half of the mse cases
        c.d = d;
        c.dtype = dtype;
        c.appends = {{0, 0, 37}, {1, 3, 61}, {0, 37, 90}};
        c.label = "modes";
        run_case(c, fresh_seed());
        ++i;
      }
    }
  }
}

TEST(CudaEncodeFast, LargeBatches) {
  SKIP_WITHOUT_GPU();
  struct Big {
    const char* mode;
    std::uint32_t d;
    DType dtype;
  };
  const Big bigs[] = {{"recommended", 128, DType::BF16},
                      {"seed", 128, DType::BF16},
                      {"k=prod4,v=mse4", 64, DType::F16},
                      {"k=mse5,v=mse2,nc", 256, DType::F32}};
  for (const Big& b : bigs) {
    Case c;
    c.mode = b.mode;
    c.d = b.d;
    c.dtype = b.dtype;
    c.kv_heads = 8;
    c.sequences = 1;
    c.capacity = 3000;
    c.appends = {{0, 0, 3000}};
    c.label = "large";
    run_case(c, fresh_seed());
  }
}

TEST(CudaEncodeFast, AdversarialRows) {
  SKIP_WITHOUT_GPU();
  const std::vector<RowKind> kinds = {RowKind::Gaussian, RowKind::Tie,      RowKind::Zero,      RowKind::Gaussian,
                                      RowKind::HalfZero, RowKind::OneHot,   RowKind::Tiny,      RowKind::Subnormal,
                                      RowKind::Huge,     RowKind::Overflow, RowKind::NaN,       RowKind::Tie,
                                      RowKind::Inf,      RowKind::Gaussian, RowKind::Tie,       RowKind::NcOverflow};
  std::string names;
  for (RowKind k : kinds) names += std::string(kind_name(k)) + " ";
  std::printf("[encode-fast] adversarial row kinds (cycled): %s\n", names.c_str());
  const char* const modes[] = {"k=prod3,v=mse2", "k=mse4,v=mse3,nc", "k=mse2,v=mse4", "k=prod5,v=mse3",
                               "k=mse5,v=mse2,nc", "k=prod2,v=mse4"};
  std::size_t i = 0;
  for (std::uint32_t d : kDims) {
    for (DType dtype : kDtypes) {
      Case c;
      c.mode = modes[i % 6];
      c.d = d;
      c.dtype = dtype;
      c.kv_heads = 4;
      c.capacity = 200;
      c.appends = {{0, 0, 77}, {1, 11, 45}};
      c.kinds = kinds;
      c.label = "adversarial";
      run_case(c, fresh_seed());
      ++i;
    }
  }
}

TEST(CudaEncodeFast, UnalignedAppendsAndWindowRing) {
  SKIP_WITHOUT_GPU();
  // Appends of 1, 3, 7, 33, ... rows at odd positions; windows 8 (appends longer than W: only the last W rows
  // reach the ring) and 64 (appends shorter than W).
  const std::vector<Append> appends = {{0, 0, 1},  {0, 1, 3},   {1, 0, 7},  {0, 4, 33},  {1, 7, 129},
                                       {0, 37, 5}, {1, 136, 2}, {0, 42, 77}, {1, 138, 61}};
  const char* const modes[] = {"k=mse4,v=mse3,nc,w=8", "k=prod3,v=mse2,w=64", "k=mse3,v=mse4,w=8",
                               "k=prod5,v=mse3,w=64"};
  std::size_t i = 0;
  for (std::uint32_t d : kDims) {
    for (const char* mode : modes) {
      Case c;
      c.mode = mode;
      c.d = d;
      c.dtype = kDtypes[i % 3];
      c.kv_heads = 3;
      c.capacity = 211;
      c.appends = appends;
      c.label = "appends";
      run_case(c, fresh_seed());
      ++i;
    }
  }
}

TEST(CudaEncodeFast, MisalignedInputTakesTheGeneralKernel) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : kDtypes) {
    Case c;
    c.mode = "k=prod3,v=mse3,w=8";
    c.d = 128;
    c.dtype = dtype;
    c.appends = {{0, 0, 20}, {1, 5, 9}};
    c.kinds = {RowKind::Gaussian, RowKind::NaN, RowKind::Zero, RowKind::Gaussian};
    c.misalign_input = true;
    c.label = "misaligned";
    run_case(c, fresh_seed());
  }
}

// With norm correction the stored norm is ‖x‖ / ‖c‖, which can round to inf although ‖x‖ fits float32; the CPU
// codec refuses such rows (OutOfRange), so both kernels must zero their records and flag kEncodeNormOverflow.
// Without norm correction the same rows are valid. Fast (d = 64 / 128 / 256) and general (d = 96, misaligned
// input) paths; bf16 and f32 inputs (f16 cannot reach the bound).
TEST(CudaEncodeSmall, NormCorrectedOverflowIsFlagged) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    std::uint32_t d;
    DType dtype;
    bool misalign;
  };
  const Shape shapes[] = {{64, DType::F32, false}, {128, DType::BF16, false}, {256, DType::BF16, false},
                          {96, DType::BF16, false}, {128, DType::F32, true}};
  for (const Shape& shape : shapes) {
    for (const bool nc : {true, false}) {
      Case c;
      c.mode = nc ? "k=mse4,v=mse3,nc,w=4" : "k=mse4,v=mse3,w=4";
      c.d = shape.d;
      c.dtype = shape.dtype;
      c.misalign_input = shape.misalign;
      c.kv_heads = 2;
      c.sequences = 1;
      c.capacity = 24;
      c.appends = {{0, 2, 17}};
      c.kinds = {RowKind::Gaussian, RowKind::NcOverflow, RowKind::Gaussian};
      c.label = "nc-overflow";
      const Outcome out = run_case(c, fresh_seed());
      // The oracle's verdict, so that this test fails if the rows stop reaching the bound.
      EXPECT_EQ(out.status, nc ? kEncodeNormOverflow : 0u) << "d " << shape.d << (nc ? " nc" : " without nc");
    }
  }
}

// compute-sanitizer (memcheck, racecheck) runs *Small* tests: one short append per fast head_dim, with a
// NaN row, a zero row and the ring.
TEST(CudaEncodeSmall, OneShortAppendPerHeadDim) {
  SKIP_WITHOUT_GPU();
  for (std::uint32_t d : kDims) {
    Case c;
    c.mode = d == 128 ? "k=prod3,v=mse2,w=4" : "k=mse4,v=mse3,nc,w=4";
    c.d = d;
    c.dtype = d == 64 ? DType::F32 : DType::BF16;
    c.kv_heads = 2;
    c.sequences = 1;
    c.capacity = 12;
    c.appends = {{0, 1, 9}};
    c.kinds = {RowKind::Gaussian, RowKind::NaN, RowKind::Zero, RowKind::Gaussian, RowKind::Huge};
    c.label = "small";
    run_case(c, fresh_seed());
  }
}

}  // namespace
}  // namespace kvcompact::cuda::tq
