// SparseCsrLinear: y = x · Wᵀ + b for a pruned weight W [out, in] kept as CSR
// arrays, through LibTorch's own sparse CSR operators — on a GPU those are
// cuSPARSE's, on the CPU LibTorch's — as an autograd op:
//
//   forward          y  = (W · xᵀ)ᵀ            sparse × dense (SpMM)
//   backward input   dx = dy · W               dense × sparse
//   backward weight  dW at W's stored entries  sampled dense × dense (SDDMM)
//   backward bias    dy summed over samples
//
// It is the second CSR implementation a pruned matrix may pick
// (prunable_linear.h), next to our own kernels (csr_linear.h, CPU only):
// the tensors may live on any device LibTorch's sparse CSR supports.
// Thread-compatible (no state).
#ifndef DYNMO_TRAINER_MODEL_SPARSE_CSR_LINEAR_H_
#define DYNMO_TRAINER_MODEL_SPARSE_CSR_LINEAR_H_

#include <torch/torch.h>

#include <cstdint>

namespace dynmo::trainer {

// x [..., in] float -> [..., out]. `values` [nnz] float (trainable),
// `row_ptr` [out + 1] and `col_idx` [nnz] (int32 or int64, the same), all
// on x's device; `bias` [out] or undefined. Throws c10::Error on shape or
// device mismatches (like torch ops).
torch::Tensor SparseCsrLinear(const torch::Tensor& x, const torch::Tensor& values,
                              const torch::Tensor& bias, const torch::Tensor& row_ptr,
                              const torch::Tensor& col_idx, int64_t out, int64_t in);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_SPARSE_CSR_LINEAR_H_
