#include "kernels/csr_matrix.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace dynmo::kernels {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// [[ 1, 0, -3],
//  [ 0, 0,  0],
//  [0.5, 2,  0]]
const std::vector<float> kDense = {1, 0, -3, 0, 0, 0, 0.5f, 2, 0};

TEST(CsrMatrixTest, ThresholdKeepsEntriesAtOrAboveMagnitude) {
  auto m = CsrMatrix::FromDenseThreshold(kDense, 3, 3, 1.0f);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->row_ptr(), ElementsAre(0, 2, 2, 3));
  EXPECT_THAT(m->col_idx(), ElementsAre(0, 2, 1));
  EXPECT_THAT(m->values(), ElementsAre(1.0f, -3.0f, 2.0f));
  EXPECT_EQ(m->nnz(), 3);
  EXPECT_NEAR(m->sparsity(), 6.0 / 9.0, 1e-12);
}

TEST(CsrMatrixTest, ZeroThresholdIsDenseAndInfiniteThresholdIsEmpty) {
  auto all = CsrMatrix::FromDenseThreshold(kDense, 3, 3, 0.0f);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->nnz(), 9);
  EXPECT_EQ(all->sparsity(), 0.0);
  auto none = CsrMatrix::FromDenseThreshold(
      kDense, 3, 3, std::numeric_limits<float>::infinity());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->nnz(), 0);
  EXPECT_THAT(none->row_ptr(), ElementsAre(0, 0, 0, 0));
  EXPECT_EQ(none->sparsity(), 1.0);
}

TEST(CsrMatrixTest, MaskKeepsMarkedEntriesIncludingZeros) {
  const std::vector<uint8_t> keep = {0, 1, 0, 0, 0, 0, 1, 0, 1};
  auto m = CsrMatrix::FromDenseMask(kDense, keep, 3, 3);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->row_ptr(), ElementsAre(0, 1, 1, 3));
  EXPECT_THAT(m->col_idx(), ElementsAre(1, 0, 2));
  EXPECT_THAT(m->values(), ElementsAre(0.0f, 0.5f, 0.0f));
}

TEST(CsrMatrixTest, ToDenseRoundTrips) {
  auto m = CsrMatrix::FromDenseThreshold(kDense, 3, 3, 1e-6f);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->ToDense(), kDense);
}

TEST(CsrMatrixTest, RejectsShapeMismatchAndBadThreshold) {
  EXPECT_THAT(CsrMatrix::FromDenseThreshold(kDense, 2, 3, 0.1f).status().message(),
              HasSubstr("expected rows*cols"));
  EXPECT_FALSE(CsrMatrix::FromDenseThreshold(kDense, 3, 3, -1.0f).ok());
  EXPECT_FALSE(CsrMatrix::FromDenseThreshold(
                   kDense, 3, 3, std::numeric_limits<float>::quiet_NaN())
                   .ok());
  EXPECT_THAT(CsrMatrix::FromDenseMask(kDense, {1, 0}, 3, 3).status().message(),
              HasSubstr("keep mask"));
}

TEST(CsrMatrixTest, CreateAcceptsValidArrays) {
  auto m = CsrMatrix::Create(2, 4, {0, 2, 3}, {1, 3, 0}, {1, 2, 3});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->ToDense(), (std::vector<float>{0, 1, 0, 2, 3, 0, 0, 0}));
}

TEST(CsrMatrixTest, CreateRejectsEachBrokenInvariantWithItsName) {
  struct Case {
    std::vector<int32_t> row_ptr, col_idx;
    std::vector<float> values;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{0, 2}, {0, 1}, {1, 1}, "expected rows + 1"},
      {{1, 2, 3}, {0, 1}, {1, 1}, "row_ptr[0] must be 0"},
      {{0, 2, 1}, {0, 1}, {1, 1}, "not monotone at row 1"},
      {{0, 1, 3}, {0, 1}, {1, 1}, "row_ptr[rows] = 3"},
      {{0, 1, 2}, {0, 1}, {1}, "values has 1"},
      {{0, 1, 2}, {0, 4}, {1, 1}, "outside [0, 4)"},
      {{0, 1, 2}, {0, -1}, {1, 1}, "outside [0, 4)"},
      {{0, 2, 2}, {2, 1}, {1, 1}, "not strictly increasing in row 0"},
      {{0, 2, 2}, {1, 1}, {1, 1}, "not strictly increasing in row 0"},
  };
  for (const Case& c : cases) {
    auto m = CsrMatrix::Create(2, 4, c.row_ptr, c.col_idx, c.values);
    ASSERT_FALSE(m.ok()) << c.message;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr(c.message));
  }
}

TEST(CsrMatrixTest, MutableValuesChangeValuesButNotPattern) {
  auto m = CsrMatrix::FromDenseThreshold(kDense, 3, 3, 1.0f);
  ASSERT_TRUE(m.ok());
  m->mutable_values()[1] = 7.0f;
  EXPECT_THAT(m->values(), ElementsAre(1.0f, 7.0f, 2.0f));
  EXPECT_THAT(m->col_idx(), ElementsAre(0, 2, 1));
}

}  // namespace
}  // namespace dynmo::kernels
