#include "kernels/csr_matrix.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace dynmo::kernels {
namespace {

absl::Status CheckShape(int64_t elements, int32_t rows, int32_t cols,
                        const char* what) {
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError("CSR shape must be non-negative, got " +
                                      std::to_string(rows) + "x" +
                                      std::to_string(cols));
  }
  if (elements != int64_t{rows} * cols) {
    return absl::InvalidArgumentError(
        std::string(what) + " has " + std::to_string(elements) +
        " elements, expected rows*cols = " + std::to_string(rows) + "*" +
        std::to_string(cols));
  }
  return absl::OkStatus();
}

// Builds from a dense matrix, keeping entry (r, c) when keep(r, c).
template <typename Keep>
absl::StatusOr<CsrMatrix> FromDense(absl::Span<const float> dense,
                                    int32_t rows, int32_t cols, Keep keep) {
  std::vector<int32_t> row_ptr(static_cast<size_t>(rows) + 1, 0);
  std::vector<int32_t> col_idx;
  std::vector<float> values;
  for (int32_t r = 0; r < rows; ++r) {
    const float* row = dense.data() + int64_t{r} * cols;
    for (int32_t c = 0; c < cols; ++c) {
      if (!keep(int64_t{r} * cols + c)) continue;
      if (values.size() >= static_cast<size_t>(
                               std::numeric_limits<int32_t>::max())) {
        return absl::InvalidArgumentError(
            "CSR matrix would hold more than 2^31-1 nonzeros");
      }
      col_idx.push_back(c);
      values.push_back(row[c]);
    }
    row_ptr[r + 1] = static_cast<int32_t>(values.size());
  }
  return CsrMatrix::Create(rows, cols, std::move(row_ptr), std::move(col_idx),
                           std::move(values));
}

}  // namespace

absl::StatusOr<CsrMatrix> CsrMatrix::Create(int32_t rows, int32_t cols,
                                            std::vector<int32_t> row_ptr,
                                            std::vector<int32_t> col_idx,
                                            std::vector<float> values) {
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError("CSR shape must be non-negative, got " +
                                      std::to_string(rows) + "x" +
                                      std::to_string(cols));
  }
  if (row_ptr.size() != static_cast<size_t>(rows) + 1) {
    return absl::InvalidArgumentError(
        "row_ptr has " + std::to_string(row_ptr.size()) +
        " entries, expected rows + 1 = " + std::to_string(int64_t{rows} + 1));
  }
  if (col_idx.size() != values.size()) {
    return absl::InvalidArgumentError(
        "col_idx has " + std::to_string(col_idx.size()) + " entries but values has " +
        std::to_string(values.size()));
  }
  if (row_ptr[0] != 0) {
    return absl::InvalidArgumentError("row_ptr[0] must be 0, got " +
                                      std::to_string(row_ptr[0]));
  }
  for (int32_t r = 0; r < rows; ++r) {
    if (row_ptr[r + 1] < row_ptr[r]) {
      return absl::InvalidArgumentError(
          "row_ptr is not monotone at row " + std::to_string(r) + ": " +
          std::to_string(row_ptr[r]) + " > " + std::to_string(row_ptr[r + 1]));
    }
  }
  if (static_cast<size_t>(row_ptr[rows]) != values.size()) {
    return absl::InvalidArgumentError(
        "row_ptr[rows] = " + std::to_string(row_ptr[rows]) +
        " but there are " + std::to_string(values.size()) + " nonzeros");
  }
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t k = row_ptr[r]; k < row_ptr[r + 1]; ++k) {
      const int32_t c = col_idx[k];
      if (c < 0 || c >= cols) {
        return absl::InvalidArgumentError(
            "col_idx[" + std::to_string(k) + "] = " + std::to_string(c) +
            " in row " + std::to_string(r) + " is outside [0, " +
            std::to_string(cols) + ")");
      }
      if (k > row_ptr[r] && col_idx[k - 1] >= c) {
        return absl::InvalidArgumentError(
            "col_idx is not strictly increasing in row " + std::to_string(r) +
            " at entry " + std::to_string(k) + " (" +
            std::to_string(col_idx[k - 1]) + " then " + std::to_string(c) + ")");
      }
    }
  }
  return CsrMatrix(rows, cols, std::move(row_ptr), std::move(col_idx),
                   std::move(values));
}

absl::StatusOr<CsrMatrix> CsrMatrix::FromDenseThreshold(
    absl::Span<const float> dense, int32_t rows, int32_t cols,
    float threshold) {
  if (absl::Status s = CheckShape(dense.size(), rows, cols, "dense matrix");
      !s.ok()) {
    return s;
  }
  if (std::isnan(threshold) || threshold < 0) {
    return absl::InvalidArgumentError(
        "magnitude threshold must be >= 0, got " + std::to_string(threshold));
  }
  return FromDense(dense, rows, cols, [&](int64_t i) {
    return std::fabs(dense[i]) >= threshold;
  });
}

absl::StatusOr<CsrMatrix> CsrMatrix::FromDenseMask(
    absl::Span<const float> dense, absl::Span<const uint8_t> keep,
    int32_t rows, int32_t cols) {
  if (absl::Status s = CheckShape(dense.size(), rows, cols, "dense matrix");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckShape(keep.size(), rows, cols, "keep mask");
      !s.ok()) {
    return s;
  }
  return FromDense(dense, rows, cols, [&](int64_t i) { return keep[i] != 0; });
}

double CsrMatrix::sparsity() const {
  const double total = static_cast<double>(rows_) * cols_;
  return total == 0 ? 0.0 : 1.0 - static_cast<double>(nnz()) / total;
}

std::vector<float> CsrMatrix::ToDense() const {
  std::vector<float> dense(static_cast<size_t>(rows_) * cols_, 0.0f);
  for (int32_t r = 0; r < rows_; ++r) {
    for (int32_t k = row_ptr_[r]; k < row_ptr_[r + 1]; ++k) {
      dense[int64_t{r} * cols_ + col_idx_[k]] = values_[k];
    }
  }
  return dense;
}

}  // namespace dynmo::kernels
