#include "kernels/csr_spmm_cpu.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/random_matrices.h"

namespace dynmo::kernels {
namespace {

using testing::DenseBackwardInput;
using testing::DenseForward;
using testing::DenseWeightGrad;
using testing::RandomCsr;
using testing::RandomDense;

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                float tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_NEAR(got[j], want[j], tol) << "at " << j;
  }
}

// Odd sizes so the 4-sample blocks leave a remainder.
constexpr int32_t kOut = 37, kIn = 53;
constexpr int64_t kN = 11;

class CsrSpmmCpuSparsityTest : public ::testing::TestWithParam<double> {};

TEST_P(CsrSpmmCpuSparsityTest, ForwardMatchesDenseWithAndWithoutBias) {
  const CsrMatrix w = RandomCsr(kOut, kIn, GetParam(), 7);
  const std::vector<float> x = RandomDense(kN * kIn, 8);
  const std::vector<float> bias = RandomDense(kOut, 9);
  std::vector<float> y(kN * kOut, 123.0f);
  ASSERT_TRUE(CsrLinearForward(w, x, kN, {}, absl::MakeSpan(y)).ok());
  ExpectNear(y, DenseForward(w.ToDense(), kOut, kIn, x, kN, {}), 1e-4f);
  ASSERT_TRUE(CsrLinearForward(w, x, kN, bias, absl::MakeSpan(y)).ok());
  ExpectNear(y, DenseForward(w.ToDense(), kOut, kIn, x, kN, bias), 1e-4f);
}

TEST_P(CsrSpmmCpuSparsityTest, BackwardInputMatchesDense) {
  const CsrMatrix w = RandomCsr(kOut, kIn, GetParam(), 7);
  const std::vector<float> dy = RandomDense(kN * kOut, 10);
  std::vector<float> dx(kN * kIn, 123.0f);  // Must be overwritten.
  ASSERT_TRUE(CsrLinearBackwardInput(w, dy, kN, absl::MakeSpan(dx)).ok());
  ExpectNear(dx, DenseBackwardInput(w.ToDense(), kOut, kIn, dy, kN), 1e-4f);
}

TEST_P(CsrSpmmCpuSparsityTest, BackwardWeightIsDenseGradientAtNonzeros) {
  const CsrMatrix w = RandomCsr(kOut, kIn, GetParam(), 7);
  const std::vector<float> x = RandomDense(kN * kIn, 8);
  const std::vector<float> dy = RandomDense(kN * kOut, 10);
  std::vector<float> dw(w.nnz(), 123.0f);
  ASSERT_TRUE(CsrLinearBackwardWeight(w, dy, x, kN, absl::MakeSpan(dw)).ok());
  const std::vector<float> dense = DenseWeightGrad(kOut, kIn, dy, x, kN);
  std::vector<float> want;
  for (int32_t r = 0; r < kOut; ++r) {
    for (int32_t k = w.row_ptr()[r]; k < w.row_ptr()[r + 1]; ++k) {
      want.push_back(dense[r * kIn + w.col_idx()[k]]);
    }
  }
  ExpectNear(dw, want, 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Sparsities, CsrSpmmCpuSparsityTest,
                         ::testing::Values(0.0, 0.5, 0.9, 0.99, 1.0));

// L = Σ g ⊙ y(x, w) for a fixed g. The backward kernels must give L's
// gradients: checked by central differences on every input and weight.
TEST(CsrSpmmCpuTest, BackwardIsTheGradientOfForward) {
  const int32_t out = 6, in = 9;
  const int64_t n = 5;
  CsrMatrix w = RandomCsr(out, in, 0.6, 21);
  std::vector<float> x = RandomDense(n * in, 22);
  const std::vector<float> bias = RandomDense(out, 23);
  const std::vector<float> g = RandomDense(n * out, 24);
  auto loss = [&]() {
    std::vector<float> y(n * out);
    EXPECT_TRUE(CsrLinearForward(w, x, n, bias, absl::MakeSpan(y)).ok());
    double l = 0;
    for (size_t j = 0; j < y.size(); ++j) l += double{g[j]} * y[j];
    return l;
  };
  std::vector<float> dx(n * in), dw(w.nnz());
  ASSERT_TRUE(CsrLinearBackwardInput(w, g, n, absl::MakeSpan(dx)).ok());
  ASSERT_TRUE(CsrLinearBackwardWeight(w, g, x, n, absl::MakeSpan(dw)).ok());
  const float eps = 1e-2f;
  for (size_t j = 0; j < x.size(); ++j) {
    const float saved = x[j];
    x[j] = saved + eps;
    const double up = loss();
    x[j] = saved - eps;
    const double down = loss();
    x[j] = saved;
    EXPECT_NEAR((up - down) / (2 * eps), dx[j], 1e-3) << "x[" << j << "]";
  }
  for (int64_t k = 0; k < w.nnz(); ++k) {
    float& v = w.mutable_values()[k];
    const float saved = v;
    v = saved + eps;
    const double up = loss();
    v = saved - eps;
    const double down = loss();
    v = saved;
    EXPECT_NEAR((up - down) / (2 * eps), dw[k], 1e-3) << "w.values[" << k << "]";
  }
}

TEST(CsrSpmmCpuTest, RejectsMismatchedSpansWithoutWriting) {
  const CsrMatrix w = RandomCsr(4, 3, 0.5, 1);
  std::vector<float> x(2 * 3), y(2 * 4, 5.0f), bad(7);
  EXPECT_EQ(CsrLinearForward(w, bad, 2, {}, absl::MakeSpan(y)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CsrLinearForward(w, x, 2, bad, absl::MakeSpan(y)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CsrLinearForward(w, x, 2, {}, absl::MakeSpan(bad)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(y, ::testing::Each(5.0f));
  EXPECT_FALSE(CsrLinearBackwardInput(w, bad, 2, absl::MakeSpan(x)).ok());
  std::vector<float> dw(w.nnz() + 1);
  EXPECT_FALSE(CsrLinearBackwardWeight(w, y, x, 2, absl::MakeSpan(dw)).ok());
  EXPECT_FALSE(CsrLinearForward(w, x, -1, {}, absl::MakeSpan(y)).ok());
}

TEST(CsrSpmmCpuTest, EmptyBatchIsANoOp) {
  const CsrMatrix w = RandomCsr(4, 3, 0.5, 1);
  std::vector<float> dw(w.nnz(), 9.0f);
  EXPECT_TRUE(CsrLinearForward(w, {}, 0, {}, {}).ok());
  EXPECT_TRUE(CsrLinearBackwardInput(w, {}, 0, {}).ok());
  ASSERT_TRUE(CsrLinearBackwardWeight(w, {}, {}, 0, absl::MakeSpan(dw)).ok());
  EXPECT_THAT(dw, ::testing::Each(0.0f));
}

}  // namespace
}  // namespace dynmo::kernels
