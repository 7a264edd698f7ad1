// CPU reference kernels for a linear layer whose weight W [out, in] is stored
// as a CsrMatrix (a pruned layer). Activations are dense row-major:
//
//   forward          Y [n, out]  = X [n, in] · Wᵀ (+ bias [out])
//   backward input   dX [n, in]  = dY [n, out] · W
//   backward weight  dW.values[k] = Σ_i dY[i, r] · X[i, c] for each stored
//                    entry k at (r, c): the dense gradient sampled at W's
//                    pattern (SDDMM), so pruned weights stay pruned.
//
// Work is proportional to n · nnz, so a layer at 90% sparsity does a tenth of
// the dense multiply-adds (bench/kernels_bench.cc measures the real speedup).
// The kernels overwrite their outputs, allocate nothing and never re-check W's
// structure (CsrMatrix guarantees it); they check only the span sizes, and
// return InvalidArgument on a mismatch without touching the output.
// Stateless; safe to call concurrently on distinct outputs.
#ifndef DYNMO_KERNELS_CSR_SPMM_CPU_H_
#define DYNMO_KERNELS_CSR_SPMM_CPU_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/csr_matrix.h"

namespace dynmo::kernels {

// Writes y [n, w.rows()] = x [n, w.cols()] · wᵀ, plus `bias` [w.rows()] on
// every row when `bias` is non-empty.
absl::Status CsrLinearForward(const CsrMatrix& w, absl::Span<const float> x,
                              int64_t n, absl::Span<const float> bias,
                              absl::Span<float> y);

// Writes dx [n, w.cols()] = dy [n, w.rows()] · w.
absl::Status CsrLinearBackwardInput(const CsrMatrix& w,
                                    absl::Span<const float> dy, int64_t n,
                                    absl::Span<float> dx);

// Writes dw_values [w.nnz()], the weight gradient at w's stored entries, from
// dy [n, w.rows()] and the forward input x [n, w.cols()].
absl::Status CsrLinearBackwardWeight(const CsrMatrix& w,
                                     absl::Span<const float> dy,
                                     absl::Span<const float> x, int64_t n,
                                     absl::Span<float> dw_values);

}  // namespace dynmo::kernels

#endif  // DYNMO_KERNELS_CSR_SPMM_CPU_H_
