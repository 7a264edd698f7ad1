// CUDA versions of the CSR linear-layer kernels in csr_spmm_cpu.h, for the
// trainer to wrap around its own device tensors. Everything is a plain device
// pointer plus shapes; W is the three arrays of a CsrMatrix copied to the GPU
// (row_ptr [out + 1], col_idx [nnz], values [nnz], int32 indices).
//
//   forward          one warp per (sample, output row): the lanes stride over
//                    the row's nonzeros and reduce with shuffles.
//   backward input   one warp per (sample, W row), scattering with atomicAdd
//                    into dx (zeroed first); sums may differ from the CPU
//                    result in the last bits because the order is not fixed.
//   backward weight  one warp per W row: lanes own the row's nonzeros and
//                    loop over the samples (SDDMM).
//
// Launchers are asynchronous on `stream` (nullptr: the default stream) and
// return the launch's cudaError_t; they do not check the CSR structure.
// Compiled only when CMake finds nvcc (DYNMO_HAVE_CUDA_KERNELS is defined).
#ifndef DYNMO_KERNELS_CSR_SPMM_CUDA_H_
#define DYNMO_KERNELS_CSR_SPMM_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dynmo::kernels {

// Device view of a CsrMatrix: W [rows = out, cols = in].
struct CsrDeviceView {
  int32_t rows = 0;
  int32_t cols = 0;
  int64_t nnz = 0;
  const int32_t* row_ptr = nullptr;
  const int32_t* col_idx = nullptr;
  const float* values = nullptr;
};

// y [n, rows] = x [n, cols] · Wᵀ (+ bias [rows] when non-null).
cudaError_t CsrLinearForwardCuda(const CsrDeviceView& w, const float* x,
                                 int64_t n, const float* bias, float* y,
                                 cudaStream_t stream);

// dx [n, cols] = dy [n, rows] · W.
cudaError_t CsrLinearBackwardInputCuda(const CsrDeviceView& w, const float* dy,
                                       int64_t n, float* dx,
                                       cudaStream_t stream);

// dw_values [nnz] = Σ_i dy[i, r] · x[i, c] at each stored (r, c).
cudaError_t CsrLinearBackwardWeightCuda(const CsrDeviceView& w,
                                        const float* dy, const float* x,
                                        int64_t n, float* dw_values,
                                        cudaStream_t stream);

}  // namespace dynmo::kernels

#endif  // DYNMO_KERNELS_CSR_SPMM_CUDA_H_
