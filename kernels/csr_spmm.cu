// CUDA CSR SpMM kernels; see csr_spmm_cuda.h for the mapping of work to warps.
#include "kernels/csr_spmm_cuda.h"

namespace dynmo::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

__device__ float WarpSum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Grid: x covers W's rows kWarpsPerBlock at a time, y covers samples.
__global__ void ForwardKernel(CsrDeviceView w, const float* __restrict__ x,
                              const float* __restrict__ bias,
                              float* __restrict__ y) {
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int64_t i = blockIdx.y;
  if (r >= w.rows) return;  // Whole warp leaves together.
  const float* xi = x + i * w.cols;
  float acc = 0.0f;
  for (int32_t k = w.row_ptr[r] + lane; k < w.row_ptr[r + 1]; k += kWarp) {
    acc += w.values[k] * xi[w.col_idx[k]];
  }
  acc = WarpSum(acc);
  if (lane == 0) y[i * w.rows + r] = acc + (bias ? bias[r] : 0.0f);
}

__global__ void BackwardInputKernel(CsrDeviceView w,
                                    const float* __restrict__ dy,
                                    float* __restrict__ dx) {
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  const int64_t i = blockIdx.y;
  if (r >= w.rows) return;
  const float g = dy[i * w.rows + r];
  if (g == 0.0f) return;
  float* dxi = dx + i * w.cols;
  for (int32_t k = w.row_ptr[r] + lane; k < w.row_ptr[r + 1]; k += kWarp) {
    atomicAdd(&dxi[w.col_idx[k]], g * w.values[k]);
  }
}

__global__ void BackwardWeightKernel(CsrDeviceView w,
                                     const float* __restrict__ dy,
                                     const float* __restrict__ x, int64_t n,
                                     float* __restrict__ dw) {
  const int lane = threadIdx.x % kWarp;
  const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp;
  if (r >= w.rows) return;
  for (int32_t k = w.row_ptr[r] + lane; k < w.row_ptr[r + 1]; k += kWarp) {
    const int32_t c = w.col_idx[k];
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += dy[i * w.rows + r] * x[i * w.cols + c];
    dw[k] = acc;
  }
}

dim3 RowGrid(const CsrDeviceView& w, int64_t samples) {
  return dim3((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock,
              static_cast<unsigned>(samples));
}

}  // namespace

cudaError_t CsrLinearForwardCuda(const CsrDeviceView& w, const float* x,
                                 int64_t n, const float* bias, float* y,
                                 cudaStream_t stream) {
  if (n == 0 || w.rows == 0) return cudaSuccess;
  if (n > 65535) return cudaErrorInvalidValue;  // grid.y limit
  ForwardKernel<<<RowGrid(w, n), kWarp * kWarpsPerBlock, 0, stream>>>(w, x, bias, y);
  return cudaGetLastError();
}

cudaError_t CsrLinearBackwardInputCuda(const CsrDeviceView& w, const float* dy,
                                       int64_t n, float* dx,
                                       cudaStream_t stream) {
  if (n == 0 || w.cols == 0) return cudaSuccess;
  if (n > 65535) return cudaErrorInvalidValue;
  cudaError_t err = cudaMemsetAsync(
      dx, 0, static_cast<size_t>(n) * w.cols * sizeof(float), stream);
  if (err != cudaSuccess || w.rows == 0) return err;
  BackwardInputKernel<<<RowGrid(w, n), kWarp * kWarpsPerBlock, 0, stream>>>(w, dy, dx);
  return cudaGetLastError();
}

cudaError_t CsrLinearBackwardWeightCuda(const CsrDeviceView& w,
                                        const float* dy, const float* x,
                                        int64_t n, float* dw_values,
                                        cudaStream_t stream) {
  if (w.nnz == 0) return cudaSuccess;
  BackwardWeightKernel<<<RowGrid(w, 1), kWarp * kWarpsPerBlock, 0, stream>>>(
      w, dy, x, n, dw_values);
  return cudaGetLastError();
}

}  // namespace dynmo::kernels
