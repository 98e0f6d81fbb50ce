// The order in which the lightning indexer sums its 64 head terms (one block of heads), private to src/dsv4
// and shared with the tests. The GPU score kernels (cuda_dsv4/indexer_scores.cu, indexer_scores_wgmma.cu) sum in
// this order from their tensor-core accumulators, so CPU and GPU scores are the same bits without a 64-long chain
// of dependent adds.
#pragma once

namespace kvcompact::dsv4::detail {

// t[0..64): with h = 32 a + 16 m + 2 g + b, the pairs (b), then the two m, then a butterfly over g (pairs of g,
// pairs of pairs, halves), then the two a.
inline float head_block_sum(const float* t) {
  float x[2];
  for (int a = 0; a < 2; ++a) {
    float v[8];
    for (int g = 0; g < 8; ++g) {
      const float* p = t + 32 * a + 2 * g;
      v[g] = (p[0] + p[1]) + (p[16] + p[17]);
    }
    x[a] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  }
  return x[0] + x[1];
}

}  // namespace kvcompact::dsv4::detail
