// CsrLinear: y = x · Wᵀ + b for a pruned weight W [out, in] kept in CSR, as a
// LibTorch autograd op whose forward AND backward run the CSR kernels of
// kernels/csr_spmm_cpu.h:
//
//   forward          CsrLinearForward        y  = x · Wᵀ + b
//   backward input   CsrLinearBackwardInput  dx = dy · W
//   backward weight  CsrLinearBackwardWeight dW at W's nonzeros only (SDDMM)
//   backward bias    dy summed over samples
//
// so the gradient of the values tensor [nnz] exists only for stored weights
// and pruned weights stay pruned. The structure (row_ptr, col_idx) lives in
// a CsrWeight built once per sparsity pattern; the values are the trainable
// parameter and are copied into it before each kernel call (nnz floats, a
// fraction of the n·nnz multiply-adds). CPU float32 only (the CUDA kernels
// of kernels/csr_spmm.cu are not wired here).
// A CsrWeight is mutated by every call: one thread per module.
#ifndef DYNMO_TRAINER_MODEL_CSR_LINEAR_H_
#define DYNMO_TRAINER_MODEL_CSR_LINEAR_H_

#include <torch/torch.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/csr_matrix.h"

namespace dynmo::trainer {

// The sparsity pattern of a pruned weight, in the kernels' own matrix.
struct CsrWeight : torch::CustomClassHolder {
  explicit CsrWeight(kernels::CsrMatrix m) : matrix(std::move(m)) {}
  kernels::CsrMatrix matrix;
};

// A CsrWeight with the pattern of `row_ptr` [rows + 1] and `col_idx` [nnz]
// (int32, CPU) and zero values. INVALID_ARGUMENT when the arrays are not a
// valid CSR structure (kernels::CsrMatrix::Create's checks).
absl::StatusOr<c10::intrusive_ptr<CsrWeight>> MakeCsrWeight(int64_t rows, int64_t cols,
                                                            const torch::Tensor& row_ptr,
                                                            const torch::Tensor& col_idx);

// x [..., in] float -> [..., out]. `values` [nnz] float (trainable), `bias`
// [out] or undefined. Throws c10::Error on shape mismatches (like torch ops).
torch::Tensor CsrLinear(const torch::Tensor& x, const torch::Tensor& values,
                        const torch::Tensor& bias,
                        const c10::intrusive_ptr<CsrWeight>& weight);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_CSR_LINEAR_H_
