// CsrMatrix: a float matrix in compressed sparse row form, the storage of a
// pruned linear layer's weight W [out, in] (rows = out, cols = in).
//
//   row_ptr  rows + 1 offsets, row_ptr[0] == 0, non-decreasing,
//            row_ptr[rows] == nnz; row r owns entries [row_ptr[r], row_ptr[r+1]).
//   col_idx  nnz column indices, each in [0, cols), strictly increasing
//            within a row (so no duplicates).
//   values   nnz floats, parallel to col_idx.
//
// A CsrMatrix can only be built through the factories below, so its structure
// is always valid; the kernels trust it and never re-check it. The values may
// change (an optimizer step) through mutable_values(); the sparsity pattern
// may not. Indices are int32 so the same arrays can be copied to a GPU as is.
// A value type; thread-compatible.
#ifndef DYNMO_KERNELS_CSR_MATRIX_H_
#define DYNMO_KERNELS_CSR_MATRIX_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dynmo::kernels {

class CsrMatrix {
 public:
  // Returns the matrix made of these arrays after checking the invariants
  // above; InvalidArgument names the first violation (row and index).
  static absl::StatusOr<CsrMatrix> Create(int32_t rows, int32_t cols,
                                          std::vector<int32_t> row_ptr,
                                          std::vector<int32_t> col_idx,
                                          std::vector<float> values);

  // Returns the entries of the dense row-major `dense` [rows, cols] whose
  // magnitude is >= `threshold` (magnitude pruning). `threshold` must not be
  // negative or NaN; +inf keeps only infinite entries, 0 keeps everything.
  static absl::StatusOr<CsrMatrix> FromDenseThreshold(
      absl::Span<const float> dense, int32_t rows, int32_t cols,
      float threshold);

  // Returns the entries of `dense` [rows, cols] whose `keep` byte is nonzero,
  // zeros included (a kept weight that happens to be 0 stays trainable).
  static absl::StatusOr<CsrMatrix> FromDenseMask(absl::Span<const float> dense,
                                                 absl::Span<const uint8_t> keep,
                                                 int32_t rows, int32_t cols);

  int32_t rows() const { return rows_; }
  int32_t cols() const { return cols_; }
  int64_t nnz() const { return static_cast<int64_t>(values_.size()); }
  // Fraction of entries that are NOT stored: 0 for dense, 1 for empty.
  double sparsity() const;

  absl::Span<const int32_t> row_ptr() const { return row_ptr_; }
  absl::Span<const int32_t> col_idx() const { return col_idx_; }
  absl::Span<const float> values() const { return values_; }
  absl::Span<float> mutable_values() { return absl::MakeSpan(values_); }

  // Returns the dense row-major [rows, cols] matrix, zeros where not stored.
  std::vector<float> ToDense() const;

 private:
  CsrMatrix(int32_t rows, int32_t cols, std::vector<int32_t> row_ptr,
            std::vector<int32_t> col_idx, std::vector<float> values)
      : rows_(rows),
        cols_(cols),
        row_ptr_(std::move(row_ptr)),
        col_idx_(std::move(col_idx)),
        values_(std::move(values)) {}

  int32_t rows_;
  int32_t cols_;
  std::vector<int32_t> row_ptr_;
  std::vector<int32_t> col_idx_;
  std::vector<float> values_;
};

}  // namespace dynmo::kernels

#endif  // DYNMO_KERNELS_CSR_MATRIX_H_
