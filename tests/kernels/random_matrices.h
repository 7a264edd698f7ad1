// Test helpers: seeded random dense matrices, sparse weights at a chosen
// sparsity, and the naive dense linear-layer references the kernels are
// checked against.
#ifndef DYNMO_TESTS_KERNELS_RANDOM_MATRICES_H_
#define DYNMO_TESTS_KERNELS_RANDOM_MATRICES_H_

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/csr_matrix.h"

namespace dynmo::kernels::testing {

inline std::vector<float> RandomDense(int64_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> m(static_cast<size_t>(size));
  for (float& x : m) x = dist(rng);
  return m;
}

// A [rows, cols] weight keeping each entry with probability 1 - sparsity
// (exactly all at 0, none at 1).
inline CsrMatrix RandomCsr(int32_t rows, int32_t cols, double sparsity,
                           uint64_t seed) {
  std::vector<float> dense = RandomDense(int64_t{rows} * cols, seed);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint8_t> keep(dense.size());
  for (uint8_t& k : keep) k = u(rng) >= sparsity ? 1 : 0;
  return *CsrMatrix::FromDenseMask(dense, keep, rows, cols);
}

// y [n, out] = x [n, in] · wᵀ + bias, all dense, in double.
inline std::vector<float> DenseForward(const std::vector<float>& w, int64_t out,
                                       int64_t in, const std::vector<float>& x,
                                       int64_t n, const std::vector<float>& bias) {
  std::vector<float> y(static_cast<size_t>(n * out));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < out; ++r) {
      double a = bias.empty() ? 0.0 : bias[r];
      for (int64_t c = 0; c < in; ++c) a += double{x[i * in + c]} * w[r * in + c];
      y[i * out + r] = static_cast<float>(a);
    }
  }
  return y;
}

// dx [n, in] = dy [n, out] · w.
inline std::vector<float> DenseBackwardInput(const std::vector<float>& w,
                                             int64_t out, int64_t in,
                                             const std::vector<float>& dy,
                                             int64_t n) {
  std::vector<float> dx(static_cast<size_t>(n * in));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < in; ++c) {
      double a = 0.0;
      for (int64_t r = 0; r < out; ++r) a += double{dy[i * out + r]} * w[r * in + c];
      dx[i * in + c] = static_cast<float>(a);
    }
  }
  return dx;
}

// The full dense weight gradient dW [out, in] = dyᵀ · x.
inline std::vector<float> DenseWeightGrad(int64_t out, int64_t in,
                                          const std::vector<float>& dy,
                                          const std::vector<float>& x,
                                          int64_t n) {
  std::vector<float> dw(static_cast<size_t>(out * in));
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      double a = 0.0;
      for (int64_t i = 0; i < n; ++i) a += double{dy[i * out + r]} * x[i * in + c];
      dw[r * in + c] = static_cast<float>(a);
    }
  }
  return dw;
}

}  // namespace dynmo::kernels::testing

#endif  // DYNMO_TESTS_KERNELS_RANDOM_MATRICES_H_
