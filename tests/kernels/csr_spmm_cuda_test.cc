// The CUDA CSR kernels against the CPU reference. Every test skips when the
// CUDA kernels were not built (no nvcc) or no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/csr_spmm_cpu.h"
#include "tests/kernels/random_matrices.h"

#ifdef DYNMO_HAVE_CUDA_KERNELS
#include <cuda_runtime_api.h>

#include "kernels/csr_spmm_cuda.h"
#endif

namespace dynmo::kernels {
namespace {

#ifdef DYNMO_HAVE_CUDA_KERNELS

bool HaveCudaDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveCudaDevice()) GTEST_SKIP() << "no CUDA device"

// A device copy of a host vector, freed on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes()), cudaSuccess);
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  T* get() { return static_cast<T*>(ptr_); }
  std::vector<T> ToHost() const {
    std::vector<T> host(size_);
    if (size_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }

 private:
  size_t bytes() const { return std::max<size_t>(size_, 1) * sizeof(T); }
  size_t size_;
  void* ptr_ = nullptr;
};

template <typename T>
std::vector<T> ToVector(absl::Span<const T> s) {
  return std::vector<T>(s.begin(), s.end());
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_NEAR(got[j], want[j], 1e-3f) << "at " << j;
  }
}

class CsrSpmmCudaTest : public ::testing::TestWithParam<double> {};

TEST_P(CsrSpmmCudaTest, AllThreeKernelsMatchTheCpuReference) {
  SKIP_WITHOUT_GPU();
  constexpr int32_t out = 70, in = 130;
  constexpr int64_t n = 9;
  const CsrMatrix w = testing::RandomCsr(out, in, GetParam(), 3);
  const std::vector<float> x = testing::RandomDense(n * in, 4);
  const std::vector<float> dy = testing::RandomDense(n * out, 5);
  const std::vector<float> bias = testing::RandomDense(out, 6);
  std::vector<float> y(n * out), dx(n * in), dw(w.nnz());
  ASSERT_TRUE(CsrLinearForward(w, x, n, bias, absl::MakeSpan(y)).ok());
  ASSERT_TRUE(CsrLinearBackwardInput(w, dy, n, absl::MakeSpan(dx)).ok());
  ASSERT_TRUE(CsrLinearBackwardWeight(w, dy, x, n, absl::MakeSpan(dw)).ok());

  DeviceBuffer<int32_t> row_ptr(ToVector(w.row_ptr()));
  DeviceBuffer<int32_t> col_idx(ToVector(w.col_idx()));
  DeviceBuffer<float> values(ToVector(w.values()));
  const CsrDeviceView view{out, in, w.nnz(), row_ptr.get(), col_idx.get(),
                           values.get()};
  DeviceBuffer<float> d_x(x), d_dy(dy), d_bias(bias);
  DeviceBuffer<float> d_y(std::vector<float>(n * out, 7.0f));
  DeviceBuffer<float> d_dx(std::vector<float>(n * in, 7.0f));
  DeviceBuffer<float> d_dw(std::vector<float>(w.nnz(), 7.0f));
  ASSERT_EQ(CsrLinearForwardCuda(view, d_x.get(), n, d_bias.get(), d_y.get(),
                                 nullptr),
            cudaSuccess);
  ASSERT_EQ(CsrLinearBackwardInputCuda(view, d_dy.get(), n, d_dx.get(), nullptr),
            cudaSuccess);
  ASSERT_EQ(CsrLinearBackwardWeightCuda(view, d_dy.get(), d_x.get(), n,
                                        d_dw.get(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectNear(d_y.ToHost(), y);
  ExpectNear(d_dx.ToHost(), dx);
  ExpectNear(d_dw.ToHost(), dw);
}

INSTANTIATE_TEST_SUITE_P(Sparsities, CsrSpmmCudaTest,
                         ::testing::Values(0.0, 0.5, 0.9, 1.0));

#else  // !DYNMO_HAVE_CUDA_KERNELS

TEST(CsrSpmmCudaTest, AllThreeKernelsMatchTheCpuReference) {
  GTEST_SKIP() << "CUDA kernels not built (no nvcc found by CMake)";
}

#endif

}  // namespace
}  // namespace dynmo::kernels
