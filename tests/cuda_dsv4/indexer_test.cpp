// The DeepSeek-V4 lightning indexer and top-k kernels against the CPU on fresh random inputs (seed printed):
// scores bit for bit (model rows, ties, off-grid rows, wide spans, non-finite keys, extreme weights), top-k
// indices identical. Every test skips without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernel_cases.hpp"

namespace kvcompact::cuda::dsv4 {
namespace {

namespace kd = kvcompact::dsv4;
using namespace kernel_cases;  // the shared helpers and cases of these tests

TEST(CudaDsv4Kernels, IndexerMatchesCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  IndexerCase decode;
  decode.positions = {0, 3, 129, 2047, 2048, 9001, 40003};
  decode.zero_heads = 2;
  run_indexer_case_per_storage(decode, "decode-");
  IndexerCase c;
  c.name = "prepared-input";
  c.prepared_input = true;
  c.positions = {5000, 777};
  run_indexer_case(c);
  c.name = "48-heads-k64";
  c.prepared_input = false;
  c.heads = 48;
  c.k = 64;
  c.positions = {1000, 3};
  run_indexer_case(c);
}

TEST(CudaDsv4Kernels, IndexerTiesAndOffGridRows) {
  SKIP_WITHOUT_GPU();
  IndexerCase c;
  c.name = "ties";
  c.distinct = 5;  // thousands of rows, five distinct keys: every score is tied many times
  c.positions = {8191, 3000};
  run_indexer_case(c);
  c.name = "offgrid-bf16";
  c.distinct = 0;
  c.model_grid = false;
  c.storage = kd::IndexerStorage::Bf16;
  c.positions = {600, 130};
  run_indexer_case(c);
}

// Rows and queries whose dot products fill the 22 significant bits that the 16-bit tensor-core paths allow (every
// 101st row and head 0 at the largest allowed span, max_span_values):
// every score must still equal the CPU's bits, with no row on the scalar path (for FP8 / MXFP4 rows too).
TEST(CudaDsv4Kernels, IndexerWideSpanRows) {
  SKIP_WITHOUT_GPU();
  IndexerCase c;
  c.wide_span = true;
  c.prepared_input = true;
  c.fallback = IndexerCase::Fallback::None;
  c.positions = {20000, 4000, 777};
  run_indexer_case_per_storage(c, "wide-span-");
}

// Key rows holding NaN, infinities, subnormals or -0 (poison_indexer_rows): the rows off the grid take the scalar
// path, and every score and index still equals the CPU's (NaN scores as NaN).
TEST(CudaDsv4Kernels, IndexerNonFiniteKeys) {
  SKIP_WITHOUT_GPU();
  IndexerCase c;
  c.special_values = true;
  c.fallback = IndexerCase::Fallback::Some;
  c.positions = {2000, 301};
  run_indexer_case_per_storage(c, "special-values-");
}

// Head weights at extreme powers of two. Tiny weights make w 2^fq inexact (below the normal range), so every row
// takes the scalar path. For MXFP4 and FP8 rows the terms are w 2^fq I with a per-row power of two (2^fk, the
// FP8 scale) applied to the head sum, exact only while every product is normal in both scales and no sum
// overflows: huge weights must take the scalar path there, and at 2^80 the guard must not trigger. The BF16 rows'
// path forms the CPU's terms themselves and needs no such guard: huge weights stay on the tensor cores, and tiny
// ones leave it only for tokens where some w_h 2^fq_h is subnormal and inexact (by the draw: 2 of 30 runs on the
// H200 had no such token, so that case asserts whole tokens, not "some"). Scores stay bit-identical to the CPU
// either way.
TEST(CudaDsv4Kernels, IndexerExtremeWeights) {
  SKIP_WITHOUT_GPU();
  for (auto st : {kd::IndexerStorage::Bf16, kd::IndexerStorage::Fp8, kd::IndexerStorage::Mxfp4}) {
    IndexerCase c;
    c.storage = st;
    c.positions = {3000, 517};
    c.name = std::string("tiny-weights-") + std::string(kd::indexer_storage_name(st));
    c.weight_scale = 0x1p-113f;
    c.fallback = st == kd::IndexerStorage::Bf16 ? IndexerCase::Fallback::WholeTokens : IndexerCase::Fallback::Some;
    run_indexer_case(c);
    c.name = std::string("huge-weights-") + std::string(kd::indexer_storage_name(st));
    c.weight_scale = 0x1p112f;
    c.fallback = st == kd::IndexerStorage::Bf16 ? IndexerCase::Fallback::None : IndexerCase::Fallback::Some;
    run_indexer_case(c);
    c.name = std::string("large-weights-") + std::string(kd::indexer_storage_name(st));
    c.weight_scale = 0x1p80f;
    c.fallback = IndexerCase::Fallback::None;
    run_indexer_case(c);
  }
}

TEST(CudaDsv4Kernels, TopkMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const std::uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::printf("[dsv4-kernels] topk seed %llu\n", static_cast<unsigned long long>(seed));
  // Quantised scores (many ties), specials, lengths below / at / above k and a long list over many chunks.
  std::vector<std::vector<float>> tok;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{511}, std::size_t{512},
                        std::size_t{513}, std::size_t{5000}, std::size_t{70001}, std::size_t{262144}}) {
    std::vector<float> s(n);
    std::uniform_int_distribution<int> q(-50, 50);
    for (auto& x : s) x = static_cast<float>(q(rng)) * 0.125f;
    for (std::size_t j = 0; j < n; j += 97) s[j] = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t j = 5; j < n; j += 1013) s[j] = -0.0f;
    if (n > 10) s[10] = std::numeric_limits<float>::infinity();
    tok.push_back(std::move(s));
  }
  run_topk_case("mixed-512", tok, 512);
  run_topk_case("mixed-1024", tok, 1024);
  std::vector<std::vector<float>> all_equal(2, std::vector<float>(40000, 1.5f));
  run_topk_case("all-equal", all_equal, 512);
  std::vector<std::vector<float>> smooth(1, normal(rng, 262144));
  run_topk_case("normal-262144", smooth, 512);
  // A decode batch of 8 at 1M context (the benchmark's shape: 12- or 8-block clusters, whichever fit at once).
  std::vector<std::vector<float>> batch8;
  for (int t = 0; t < 8; ++t) batch8.push_back(normal(rng, 262144 - 4099 * static_cast<std::size_t>(t)));
  run_topk_case("batch8-normal", batch8, 512);
  // Beyond the previous version's row limit (524288 for k = 512), the widest k, k = 1, only NaN, and a batch
  // that takes one block per token instead of a cluster (more than 2 x multiprocessors / 8 tokens).
  std::vector<std::vector<float>> long_rows(1, normal(rng, 700001));
  for (std::size_t j = 3; j < long_rows[0].size(); j += 4099) long_rows[0][j] = long_rows[0][j - 3];  // exact ties
  run_topk_case("normal-700001", long_rows, 512);
  run_topk_case("normal-700001-k2048", long_rows, 2048);
  run_topk_case("normal-700001-k1", long_rows, 1);
  std::vector<std::vector<float>> nans(1, std::vector<float>(3000, std::numeric_limits<float>::quiet_NaN()));
  run_topk_case("all-nan", nans, 512);
  std::vector<std::vector<float>> many;
  for (int t = 0; t < 80; ++t) {
    std::vector<float> s(static_cast<std::size_t>(1000 + 397 * t));
    std::uniform_int_distribution<int> q(-20, 20);
    for (auto& x : s) x = static_cast<float>(q(rng));
    many.push_back(std::move(s));
  }
  run_topk_case("80-tokens-quantised", many, 512);
  // Every score in one bin of the first 11-bit digit (1 + q 2^-12, 1024 values, ~256 rows each): the blocks'
  // keys at or above that bin do not fit their shared-memory list, so the later digits (score and index) read
  // the scores from global memory again.
  std::vector<std::vector<float>> one_bin(1, std::vector<float>(262144));
  std::uniform_int_distribution<int> qb(0, 1023);
  for (auto& x : one_bin[0]) x = 1.0f + static_cast<float>(qb(rng)) * (1.0f / 4096.0f);
  run_topk_case("one-first-digit-bin", one_bin, 512);
}

}  // namespace
}  // namespace kvcompact::cuda::dsv4
