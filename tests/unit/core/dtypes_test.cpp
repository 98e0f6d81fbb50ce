// dtype conversions against independent references. Decoders: every code vs the textbook formula
// (-1)^s * 2^(e-bias) * (1 + m/2^M) evaluated with std::ldexp in double. Encoders: nearest value found by
// searching the sorted table of all finite decoded values (ties to the even code), turned into a step
// function over float bit patterns; bf16 / f16 are checked on every float32 pattern (sampled under
// KVCOMPACT_TEST_QUICK), fp8 / fp4 on all midpoints +-4 ulp, random floats and specials.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "kvcompact/core/dtypes.hpp"
#include "kvcompact/core/parallel.hpp"
#include "test_seed.hpp"

namespace kvcompact {
namespace {

bool quick_mode() { return std::getenv("KVCOMPACT_TEST_QUICK") != nullptr; }

float bits_to_float(std::uint32_t x) { return std::bit_cast<float>(x); }
std::uint32_t float_to_bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// ---- reference decoder ------------------------------------------------------------------------------

enum class Specials { Ieee, E4M3FN, None };

struct Format {
  const char* name;
  unsigned exp_bits;
  unsigned man_bits;
  int bias;
  Specials specials;
  unsigned total_bits() const { return 1 + exp_bits + man_bits; }
  std::uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
};

constexpr Format kBf16{"bf16", 8, 7, 127, Specials::Ieee};
constexpr Format kF16{"f16", 5, 10, 15, Specials::Ieee};
constexpr Format kFp8{"fp8_e4m3", 4, 3, 7, Specials::E4M3FN};
constexpr Format kFp4{"fp4_e2m1", 2, 1, 1, Specials::None};

double reference_decode(const Format& f, std::uint32_t code) {
  const bool negative = ((code >> (f.exp_bits + f.man_bits)) & 1u) != 0;
  const std::uint32_t e = (code >> f.man_bits) & ((1u << f.exp_bits) - 1u);
  const std::uint32_t m = code & ((1u << f.man_bits) - 1u);
  const std::uint32_t e_max = (1u << f.exp_bits) - 1u;
  const double sign = negative ? -1.0 : 1.0;
  if (f.specials == Specials::Ieee && e == e_max) {
    return m == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  }
  if (f.specials == Specials::E4M3FN && e == e_max && m == (1u << f.man_bits) - 1u) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  const int man_bits = static_cast<int>(f.man_bits);
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), 1 - f.bias - man_bits);
  return sign * std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -man_bits), static_cast<int>(e) - f.bias);
}

// ---- decoders: every code -------------------------------------------------------------------------------

template <typename Decode>
void check_decoder(const Format& f, Decode decode, bool nan_made_quiet) {
  const std::uint32_t codes = 1u << f.total_bits();
  int failures = 0;
  for (std::uint32_t code = 0; code < codes && failures < 10; ++code) {
    const float got = decode(code);
    const double want = reference_decode(f, code);
    const bool negative = (code & f.sign_bit()) != 0;
    if (std::isnan(want)) {
      const std::uint32_t gb = float_to_bits(got);
      const bool ok = std::isnan(got) && std::signbit(got) == negative && (!nan_made_quiet || (gb & 0x400000u));
      if (!ok) ++failures;
      EXPECT_TRUE(ok) << f.name << " code 0x" << std::hex << code << " should decode to a "
                      << (nan_made_quiet ? "quiet " : "") << "NaN of its sign, got bits 0x" << gb;
      continue;
    }
    const bool ok = static_cast<double>(got) == want && std::signbit(got) == negative;
    if (!ok) ++failures;
    EXPECT_TRUE(ok) << f.name << " code 0x" << std::hex << code << std::dec << " decodes to " << got << ", want "
                    << want;
  }
}

TEST(DTypeDecode, Bf16EveryCode) {
  check_decoder(kBf16, [](std::uint32_t c) { return bf16_to_f32(static_cast<std::uint16_t>(c)); }, false);
  // bf16 -> f32 is documented as exact widening, NaN payload included.
  for (std::uint32_t c = 0; c < 65536; ++c) {
    ASSERT_EQ(float_to_bits(bf16_to_f32(static_cast<std::uint16_t>(c))), c << 16) << "code " << c;
  }
}

TEST(DTypeDecode, F16EveryCode) {
  check_decoder(kF16, [](std::uint32_t c) { return f16_to_f32(static_cast<std::uint16_t>(c)); }, true);
}

TEST(DTypeDecode, Fp8E4M3EveryCode) {
  check_decoder(kFp8, [](std::uint32_t c) { return fp8_e4m3_to_f32(static_cast<std::uint8_t>(c)); }, true);
}

TEST(DTypeDecode, Fp4E2M1EveryCodeAndHighNibbleIgnored) {
  check_decoder(kFp4, [](std::uint32_t c) { return fp4_e2m1_to_f32(static_cast<std::uint8_t>(c)); }, false);
  for (std::uint32_t byte = 0; byte < 256; ++byte) {
    const float got = fp4_e2m1_to_f32(static_cast<std::uint8_t>(byte));
    const double want = reference_decode(kFp4, byte & 0xFu);
    EXPECT_TRUE(static_cast<double>(got) == want && std::signbit(got) == std::signbit(want)) << "byte " << byte;
  }
}

// Published values, so the reference formula itself is anchored to the standards.
TEST(DTypeDecode, PublishedValues) {
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0400), 6.103515625e-05f);        // smallest normal, 2^-14
  EXPECT_EQ(f16_to_f32(0x0001), 5.9604644775390625e-08f);  // smallest subnormal, 2^-24
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(bf16_to_f32(0x7F7F), 3.3895313892515355e38f);
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0.001953125f);  // 2^-9
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0.015625f);     // 2^-6
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xFF)));
  const float fp4[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (std::uint8_t c = 0; c < 8; ++c) {
    EXPECT_EQ(fp4_e2m1_to_f32(c), fp4[c]);
    EXPECT_EQ(fp4_e2m1_to_f32(static_cast<std::uint8_t>(c | 8u)), -fp4[c]);
  }
}

// Compile-time use is part of the contract (constexpr tables in other layers).
static_assert(f32_to_bf16(1.0f) == 0x3F80);
static_assert(f32_to_f16(1.0f) == 0x3C00 && f16_to_f32(0x3C00) == 1.0f);
static_assert(f32_to_fp8_e4m3(448.0f) == 0x7E && fp8_e4m3_to_f32(0x7E) == 448.0f);
static_assert(f32_to_fp4_e2m1(5.0f) == 0x6);  // tie between 4 (code 6) and 6 (code 7): even code
static_assert(dtype_bits(DType::F4E2M1) == 4);

// ---- encoder reference: a step function over float bit patterns -----------------------------------------

constexpr std::uint32_t kNanExpected = 0xFFFFFFFFu;  // marks the NaN range of the step function

// Expected code (without sign) for every non-negative float bit pattern, as ascending breakpoints.
struct Reference {
  std::vector<std::uint32_t> start;  // start[0] == 0
  std::vector<std::uint32_t> code;   // code for [start[i], start[i+1])

  std::uint32_t expected_abs(std::uint32_t abs_bits) const {
    const auto it = std::upper_bound(start.begin(), start.end(), abs_bits);
    return code[static_cast<std::size_t>(it - start.begin()) - 1];
  }
};

// ieee_overflow: beyond the largest finite value the next step (same spacing) is inf, which is how IEEE
// rounds with an unbounded exponent; otherwise (fp8, fp4) the largest finite value takes everything above.
Reference build_reference(const Format& f, bool ieee_overflow) {
  struct Value {
    double v;
    std::uint32_t code;
  };
  std::vector<Value> values;
  for (std::uint32_t c = 0; c < f.sign_bit(); ++c) {
    const double v = reference_decode(f, c);
    if (std::isfinite(v)) values.push_back({v, c});
  }
  std::sort(values.begin(), values.end(), [](const Value& a, const Value& b) { return a.v < b.v; });
  if (ieee_overflow) {
    const double top = values.back().v;
    const double step = top - values[values.size() - 2].v;
    values.push_back({top + step, ((1u << f.exp_bits) - 1u) << f.man_bits});
  }
  Reference ref;
  ref.start.push_back(0);
  ref.code.push_back(values.front().code);
  const double float_max = std::numeric_limits<float>::max();
  for (std::size_t i = 0; i + 1 < values.size(); ++i) {
    const Value a = values[i];
    const Value b = values[i + 1];
    const double mid = (a.v + b.v) / 2;  // exact: both have far fewer than 53 significant bits
    std::uint32_t lo = float_to_bits(static_cast<float>(a.v));
    std::uint32_t hi = b.v > float_max ? 0x7F800000u : float_to_bits(static_cast<float>(b.v));
    // First pattern in (lo, hi] whose value is >= mid; positive floats are ordered like their bits.
    while (hi - lo > 1) {
      const std::uint32_t m = lo + (hi - lo) / 2;
      if (static_cast<double>(bits_to_float(m)) >= mid) {
        hi = m;
      } else {
        lo = m;
      }
    }
    const std::uint32_t split = hi;
    if (static_cast<double>(bits_to_float(split)) == mid) {
      ref.start.push_back(split);
      ref.code.push_back((a.code & 1u) == 0 ? a.code : b.code);
      ref.start.push_back(split + 1);
    } else {
      ref.start.push_back(split);
    }
    ref.code.push_back(b.code);
  }
  if (ref.start.back() <= 0x7F800000u) {
    // inf: IEEE formats have their own code (already the last step); saturating ones keep the maximum.
    ref.start.push_back(0x7F800000u);
    ref.code.push_back(ref.code.back());
  }
  ref.start.push_back(0x7F800001u);
  ref.code.push_back(kNanExpected);
  for (std::size_t i = 1; i < ref.start.size(); ++i) {
    EXPECT_LT(ref.start[i - 1], ref.start[i]) << f.name << " reference breakpoints must ascend";
  }
  return ref;
}

// Collects mismatches from many threads; keeps the first few for the message.
class Failures {
 public:
  void add(std::uint32_t x, std::uint32_t got, std::uint32_t want) {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    if (examples_.size() < 8) {
      if (want == kNanExpected) {
        examples_ += fmt::format(" [f32 0x{:08x} (NaN) -> 0x{:x}, want the documented NaN code]", x, got);
      } else {
        examples_ += fmt::format(" [f32 0x{:08x} ({}) -> 0x{:x}, want 0x{:x}]", x, bits_to_float(x), got, want);
      }
    }
  }
  void add_count(std::uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    count_ += n;
  }
  std::uint64_t count() const { return count_; }
  const std::string& examples() const { return examples_; }

 private:
  std::mutex mu_;
  std::uint64_t count_ = 0;
  std::string examples_;
};

template <auto ENCODE>
struct EncoderUnderTest {
  const Format& format;
  bool (*nan_ok)(std::uint32_t code, bool negative);

  std::uint32_t encode(std::uint32_t x) const { return static_cast<std::uint32_t>(ENCODE(bits_to_float(x))); }

  // Check one pattern (either sign) against the reference; report a mismatch.
  void check_one(const Reference& ref, std::uint32_t x, Failures& failures) const {
    const std::uint32_t abs_bits = x & 0x7FFFFFFFu;
    const bool negative = (x >> 31) != 0;
    const std::uint32_t got = encode(x);
    const std::uint32_t want_abs = ref.expected_abs(abs_bits);
    if (want_abs == kNanExpected) {
      if (!nan_ok(got, negative)) failures.add(x, got, kNanExpected);
      return;
    }
    const std::uint32_t want = want_abs | (negative ? format.sign_bit() : 0u);
    if (got != want) failures.add(x, got, want);
  }

  // Every pattern with magnitude bits in [lo, hi), both signs. The inner loop only counts, so it stays
  // a tight loop over the encoder; a non-zero count is then re-scanned for the message.
  void check_range(const Reference& ref, std::uint32_t lo, std::uint32_t hi, Failures& failures) const {
    auto seg = static_cast<std::size_t>(std::upper_bound(ref.start.begin(), ref.start.end(), lo) - ref.start.begin()) - 1;
    std::uint32_t x = lo;
    while (x < hi) {
      const std::uint32_t seg_end = seg + 1 < ref.start.size() ? std::min(hi, ref.start[seg + 1]) : hi;
      const std::uint32_t want = ref.code[seg];
      if (want == kNanExpected) {
        for (std::uint32_t y = x; y < seg_end; ++y) {
          check_one(ref, y, failures);
          check_one(ref, y | 0x80000000u, failures);
        }
      } else {
        const std::uint32_t want_neg = want | format.sign_bit();
        std::uint32_t bad = 0;
        for (std::uint32_t y = x; y < seg_end; ++y) {
          bad += static_cast<std::uint32_t>(encode(y) != want) + static_cast<std::uint32_t>(encode(y | 0x80000000u) != want_neg);
        }
        if (bad != 0) {
          for (std::uint32_t y = x; y < seg_end; ++y) {
            check_one(ref, y, failures);
            check_one(ref, y | 0x80000000u, failures);
          }
        }
      }
      x = seg_end;
      ++seg;
    }
  }

  // Patterns within +-radius of every breakpoint (i.e. around every rounding midpoint), both signs.
  void check_breakpoints(const Reference& ref, std::uint32_t radius, Failures& failures) const {
    for (std::uint32_t s : ref.start) {
      const std::uint32_t lo = s >= radius ? s - radius : 0;
      const std::uint32_t hi = std::min<std::uint32_t>(s + radius, 0x7FFFFFFFu);
      for (std::uint32_t y = lo; y <= hi; ++y) {
        check_one(ref, y, failures);
        check_one(ref, y | 0x80000000u, failures);
      }
    }
  }
};

bool bf16_nan_ok(std::uint32_t c, bool negative) {
  return (c & 0x7F80u) == 0x7F80u && (c & 0x7Fu) != 0 && (c & 0x40u) != 0 && ((c & 0x8000u) != 0) == negative;
}
bool f16_nan_ok(std::uint32_t c, bool negative) {
  return (c & 0x7C00u) == 0x7C00u && (c & 0x3FFu) != 0 && (c & 0x200u) != 0 && ((c & 0x8000u) != 0) == negative;
}
bool fp8_nan_ok(std::uint32_t c, bool negative) { return c == (negative ? 0xFFu : 0x7Fu); }
bool fp4_nan_ok(std::uint32_t c, bool) { return c == 0; }  // documented: NaN -> +0

// Every float32 pattern (or, in quick mode, every 1021st plus all within 4 ulp of each breakpoint).
template <typename Encoder>
void check_all_patterns(const Encoder& enc, const Reference& ref) {
  Failures failures;
  if (quick_mode()) {
    constexpr std::uint64_t kStride = 1021;
    parallel_for(0, (std::uint64_t{1} << 32) / kStride + 1, 4096, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t k = lo; k < hi; ++k) {
        const std::uint64_t x = k * kStride;
        if (x <= 0xFFFFFFFFu) enc.check_one(ref, static_cast<std::uint32_t>(x), failures);
      }
    });
    enc.check_breakpoints(ref, 4, failures);
  } else {
    // Magnitude patterns [0, 2^31) in blocks; each block covers both signs.
    constexpr std::size_t kBlock = std::size_t{1} << 20;
    parallel_for(0, (std::size_t{1} << 31) / kBlock, 1, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t b = lo; b < hi; ++b) {
        enc.check_range(ref, static_cast<std::uint32_t>(b * kBlock), static_cast<std::uint32_t>((b + 1) * kBlock),
                        failures);
      }
    });
  }
  EXPECT_EQ(failures.count(), 0u) << enc.format.name << (quick_mode() ? " (quick mode)" : " (every pattern)")
                                  << failures.examples();
}

TEST(DTypeEncode, Bf16AgainstNearestValueSearch) {
  const Reference ref = build_reference(kBf16, true);
  check_all_patterns(EncoderUnderTest<f32_to_bf16>{kBf16, bf16_nan_ok}, ref);
}

TEST(DTypeEncode, F16AgainstNearestValueSearch) {
  const Reference ref = build_reference(kF16, true);
  check_all_patterns(EncoderUnderTest<f32_to_f16>{kF16, f16_nan_ok}, ref);
}

// Random patterns, random values on the format's range, and specials, for the small formats.
template <typename Encoder>
void check_sampled(const Encoder& enc, const Reference& ref, double max_finite) {
  Failures failures;
  enc.check_breakpoints(ref, 4, failures);
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> on_range(static_cast<float>(-1.25 * max_finite),
                                                 static_cast<float>(1.25 * max_finite));
  std::uniform_real_distribution<float> log_exp(-30.0f, 12.0f);
  const int n = quick_mode() ? 300000 : 2000000;
  for (int i = 0; i < n; ++i) {
    std::uint32_t x = 0;
    switch (i % 3) {
      case 0: x = static_cast<std::uint32_t>(rng()); break;
      case 1: x = float_to_bits(on_range(rng)); break;
      default:  // log-uniform magnitudes reach deep into the subnormal range
        x = float_to_bits(std::exp2(log_exp(rng))) | (rng() & 0x80000000u);
        break;
    }
    enc.check_one(ref, x, failures);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                            static_cast<float>(max_finite), static_cast<float>(-max_finite),
                            std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                            bits_to_float(0x7F800001u), bits_to_float(0xFFBFFFFFu)};
  for (float s : specials) enc.check_one(ref, float_to_bits(s), failures);
  EXPECT_EQ(failures.count(), 0u) << enc.format.name << " seed " << seed << failures.examples();
}

TEST(DTypeEncode, Fp8E4M3AgainstNearestValueSearch) {
  const Reference ref = build_reference(kFp8, false);
  check_sampled(EncoderUnderTest<f32_to_fp8_e4m3>{kFp8, fp8_nan_ok}, ref, 448.0);
}

TEST(DTypeEncode, Fp4E2M1AgainstNearestValueSearch) {
  const Reference ref = build_reference(kFp4, false);
  check_sampled(EncoderUnderTest<f32_to_fp4_e2m1>{kFp4, fp4_nan_ok}, ref, 6.0);
}

// The documented saturation / NaN choices, spelled out.
TEST(DTypeEncode, DocumentedSpecialCases) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f32_to_fp8_e4m3(inf), 0x7E);
  EXPECT_EQ(f32_to_fp8_e4m3(-inf), 0xFE);
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7E);
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7E);  // would round to 480, which is the NaN code: saturates
  EXPECT_EQ(f32_to_fp8_e4m3(nan), 0x7F);
  EXPECT_EQ(f32_to_fp8_e4m3(-nan), 0xFF);
  EXPECT_EQ(f32_to_fp4_e2m1(inf), 0x7);
  EXPECT_EQ(f32_to_fp4_e2m1(-inf), 0xF);
  EXPECT_EQ(f32_to_fp4_e2m1(-100.0f), 0xF);
  EXPECT_EQ(f32_to_fp4_e2m1(nan), 0x0);
  EXPECT_EQ(f32_to_fp4_e2m1(-nan), 0x0);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-inf), 0xFC00);
  EXPECT_EQ(f32_to_bf16(-inf), 0xFF80);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(-1e-30f), 0x8000);  // underflow keeps the sign
}

// Exact values survive a round trip through every encoder.
TEST(DTypeEncode, RoundTripOfEveryFiniteCode) {
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const auto h = static_cast<std::uint16_t>(c);
    if ((c & 0x7C00u) != 0x7C00u || (c & 0x3FFu) == 0) {
      EXPECT_EQ(f32_to_f16(f16_to_f32(h)), h) << c;
    }
    if ((c & 0x7F80u) != 0x7F80u || (c & 0x7Fu) == 0) {
      EXPECT_EQ(f32_to_bf16(bf16_to_f32(h)), h) << c;
    }
  }
  for (std::uint32_t c = 0; c < 256; ++c) {
    if ((c & 0x7Fu) != 0x7Fu) {
      EXPECT_EQ(f32_to_fp8_e4m3(fp8_e4m3_to_f32(static_cast<std::uint8_t>(c))), c) << c;
    }
  }
  for (std::uint32_t c = 0; c < 16; ++c) EXPECT_EQ(f32_to_fp4_e2m1(fp4_e2m1_to_f32(static_cast<std::uint8_t>(c))), c);
}

// ---- names and bulk conversion ----------------------------------------------------------------------------

TEST(DTypeNames, ParseRoundTripAndBits) {
  const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F4E2M1};
  const char* names[] = {"f32", "f16", "bf16", "fp8_e4m3", "fp4_e2m1"};
  const std::uint32_t bits[] = {32, 16, 16, 8, 4};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(dtype_name(all[i]), names[i]);
    auto parsed = parse_dtype(names[i]);
    ASSERT_TRUE(parsed.ok()) << names[i];
    EXPECT_EQ(*parsed, all[i]);
    EXPECT_EQ(dtype_bits(all[i]), bits[i]);
  }
  for (const char* bad : {"", "F32", "fp8", "float32", "bf16 ", "fp4"}) {
    auto parsed = parse_dtype(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.error().code, ErrorCode::InvalidArgument);
    EXPECT_NE(parsed.error().message.find(fmt::format("'{}'", bad)), std::string::npos) << parsed.error().message;
  }
  EXPECT_EQ(dtype_name(static_cast<DType>(200)), "unknown");
}

TEST(DTypeBulk, ConvertToF32MatchesScalarDecodersAtAnyAlignment) {
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  std::mt19937 rng(seed);
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{128}, std::size_t{1001}}) {
    std::vector<unsigned char> raw(n * 4 + 1);
    for (auto& b : raw) b = static_cast<unsigned char>(rng());
    const unsigned char* src = raw.data() + 1;  // deliberately misaligned
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3}) {
      std::vector<float> out(n, -12345.0f);
      ASSERT_TRUE(convert_to_f32(t, src, out.data(), n).ok());
      for (std::size_t i = 0; i < n; ++i) {
        float want = 0;
        std::uint16_t h = 0;
        switch (t) {
          case DType::F32: std::memcpy(&want, src + 4 * i, 4); break;
          case DType::F16: std::memcpy(&h, src + 2 * i, 2); want = f16_to_f32(h); break;
          case DType::BF16: std::memcpy(&h, src + 2 * i, 2); want = bf16_to_f32(h); break;
          default: want = fp8_e4m3_to_f32(src[i]); break;
        }
        ASSERT_EQ(float_to_bits(out[i]), float_to_bits(want)) << dtype_name(t) << " i=" << i << " seed " << seed;
      }
    }
  }
}

TEST(DTypeBulk, ConvertFromF32MatchesScalarEncoders) {
  const std::uint64_t seed = kvcompact::testing_support::fresh_seed();
  std::mt19937 rng(seed);
  const std::size_t n = 777;
  std::vector<float> src(n);
  for (std::size_t i = 0; i < n; ++i) {
    src[i] = i % 2 ? bits_to_float(static_cast<std::uint32_t>(rng())) : std::normal_distribution<float>(0, 100)(rng);
  }
  std::vector<unsigned char> out(n * 4 + 1);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3}) {
    ASSERT_TRUE(convert_from_f32(t, src.data(), out.data() + 1, n).ok());
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned char* p = out.data() + 1;
      std::uint32_t got = 0;
      std::uint32_t want = 0;
      switch (t) {
        case DType::F32: std::memcpy(&got, p + 4 * i, 4); want = float_to_bits(src[i]); break;
        case DType::F16: std::memcpy(&got, p + 2 * i, 2); want = f32_to_f16(src[i]); break;
        case DType::BF16: std::memcpy(&got, p + 2 * i, 2); want = f32_to_bf16(src[i]); break;
        default: got = p[i]; want = f32_to_fp8_e4m3(src[i]); break;
      }
      ASSERT_EQ(got, want) << dtype_name(t) << " i=" << i << " seed " << seed;
    }
  }
}

TEST(DTypeBulk, RejectsFp4NullAndUnknown) {
  std::uint8_t bytes[8] = {};
  float out[8] = {};
  auto s = convert_to_f32(DType::F4E2M1, bytes, out, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::Unsupported);
  EXPECT_NE(s.error().message.find("fp4_e2m1"), std::string::npos) << s.error().message;
  s = convert_from_f32(DType::F4E2M1, out, bytes, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::Unsupported);
  s = convert_to_f32(static_cast<DType>(99), bytes, out, 8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::Unsupported);
  s = convert_to_f32(DType::F16, nullptr, out, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::InvalidArgument);
  EXPECT_NE(s.error().message.find('3'), std::string::npos);
  s = convert_from_f32(DType::BF16, out, nullptr, 3);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::InvalidArgument);
  EXPECT_TRUE(convert_to_f32(DType::F16, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(convert_from_f32(DType::F16, nullptr, nullptr, 0).ok());
}

}  // namespace
}  // namespace kvcompact
