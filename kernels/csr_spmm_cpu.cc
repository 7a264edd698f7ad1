#include "kernels/csr_spmm_cpu.h"

#include <algorithm>
#include <string>

namespace dynmo::kernels {
namespace {

// Samples processed together: each stored weight (value and column index) is
// loaded once and used kBlock times, which is what keeps the sparse loops
// bound by arithmetic rather than by index loads.
constexpr int64_t kBlock = 4;

absl::Status CheckSize(absl::Span<const float> s, int64_t expected,
                       const char* what) {
  if (static_cast<int64_t>(s.size()) != expected) {
    return absl::InvalidArgumentError(
        std::string(what) + " has " + std::to_string(s.size()) +
        " elements, expected " + std::to_string(expected));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CsrLinearForward(const CsrMatrix& w, absl::Span<const float> x,
                              int64_t n, absl::Span<const float> bias,
                              absl::Span<float> y) {
  const int64_t out = w.rows(), in = w.cols();
  if (n < 0) return absl::InvalidArgumentError("n must be >= 0");
  if (absl::Status s = CheckSize(x, n * in, "x [n, in]"); !s.ok()) return s;
  if (absl::Status s = CheckSize(y, n * out, "y [n, out]"); !s.ok()) return s;
  if (!bias.empty()) {
    if (absl::Status s = CheckSize(bias, out, "bias [out]"); !s.ok()) return s;
  }
  const int32_t* row_ptr = w.row_ptr().data();
  const int32_t* col = w.col_idx().data();
  const float* val = w.values().data();
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const float* x0 = x.data() + i * in;
    const float* x1 = x0 + in;
    const float* x2 = x1 + in;
    const float* x3 = x2 + in;
    float* y0 = y.data() + i * out;
    for (int64_t r = 0; r < out; ++r) {
      const float b = bias.empty() ? 0.0f : bias[r];
      float a0 = b, a1 = b, a2 = b, a3 = b;
      for (int32_t k = row_ptr[r]; k < row_ptr[r + 1]; ++k) {
        const float v = val[k];
        const int32_t c = col[k];
        a0 += v * x0[c];
        a1 += v * x1[c];
        a2 += v * x2[c];
        a3 += v * x3[c];
      }
      y0[r] = a0;
      y0[out + r] = a1;
      y0[2 * out + r] = a2;
      y0[3 * out + r] = a3;
    }
  }
  for (; i < n; ++i) {  // The last n mod kBlock samples.
    const float* xi = x.data() + i * in;
    for (int64_t r = 0; r < out; ++r) {
      float a = bias.empty() ? 0.0f : bias[r];
      for (int32_t k = row_ptr[r]; k < row_ptr[r + 1]; ++k) {
        a += val[k] * xi[col[k]];
      }
      y[i * out + r] = a;
    }
  }
  return absl::OkStatus();
}

absl::Status CsrLinearBackwardInput(const CsrMatrix& w,
                                    absl::Span<const float> dy, int64_t n,
                                    absl::Span<float> dx) {
  const int64_t out = w.rows(), in = w.cols();
  if (n < 0) return absl::InvalidArgumentError("n must be >= 0");
  if (absl::Status s = CheckSize(dy, n * out, "dy [n, out]"); !s.ok()) return s;
  if (absl::Status s = CheckSize(dx, n * in, "dx [n, in]"); !s.ok()) return s;
  const int32_t* row_ptr = w.row_ptr().data();
  const int32_t* col = w.col_idx().data();
  const float* val = w.values().data();
  std::fill(dx.begin(), dx.end(), 0.0f);
  // Scatter form: row r of W, scaled by dy[i, r], is added into dx[i, :].
  // dx's rows stay in L1 while W streams through once per block of samples.
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const float* g0 = dy.data() + i * out;
    float* d0 = dx.data() + i * in;
    float* d1 = d0 + in;
    float* d2 = d1 + in;
    float* d3 = d2 + in;
    for (int64_t r = 0; r < out; ++r) {
      const float s0 = g0[r], s1 = g0[out + r], s2 = g0[2 * out + r],
                  s3 = g0[3 * out + r];
      for (int32_t k = row_ptr[r]; k < row_ptr[r + 1]; ++k) {
        const float v = val[k];
        const int32_t c = col[k];
        d0[c] += s0 * v;
        d1[c] += s1 * v;
        d2[c] += s2 * v;
        d3[c] += s3 * v;
      }
    }
  }
  for (; i < n; ++i) {
    const float* gi = dy.data() + i * out;
    float* di = dx.data() + i * in;
    for (int64_t r = 0; r < out; ++r) {
      const float s = gi[r];
      for (int32_t k = row_ptr[r]; k < row_ptr[r + 1]; ++k) {
        di[col[k]] += s * val[k];
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CsrLinearBackwardWeight(const CsrMatrix& w,
                                     absl::Span<const float> dy,
                                     absl::Span<const float> x, int64_t n,
                                     absl::Span<float> dw_values) {
  const int64_t out = w.rows(), in = w.cols();
  if (n < 0) return absl::InvalidArgumentError("n must be >= 0");
  if (absl::Status s = CheckSize(dy, n * out, "dy [n, out]"); !s.ok()) return s;
  if (absl::Status s = CheckSize(x, n * in, "x [n, in]"); !s.ok()) return s;
  if (absl::Status s = CheckSize(dw_values, w.nnz(), "dw_values [nnz]");
      !s.ok()) {
    return s;
  }
  const int32_t* row_ptr = w.row_ptr().data();
  const int32_t* col = w.col_idx().data();
  float* dw = dw_values.data();
  std::fill(dw_values.begin(), dw_values.end(), 0.0f);
  // Samples in the outer loop keep x's and dy's rows contiguous; dw (nnz
  // floats) is swept once per block of samples.
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const float* g0 = dy.data() + i * out;
    const float* x0 = x.data() + i * in;
    const float* x1 = x0 + in;
    const float* x2 = x1 + in;
    const float* x3 = x2 + in;
    for (int64_t r = 0; r < out; ++r) {
      const float s0 = g0[r], s1 = g0[out + r], s2 = g0[2 * out + r],
                  s3 = g0[3 * out + r];
      for (int32_t k = row_ptr[r]; k < row_ptr[r + 1]; ++k) {
        const int32_t c = col[k];
        dw[k] += s0 * x0[c] + s1 * x1[c] + s2 * x2[c] + s3 * x3[c];
      }
    }
  }
  for (; i < n; ++i) {
    const float* gi = dy.data() + i * out;
    const float* xi = x.data() + i * in;
    for (int64_t r = 0; r < out; ++r) {
      const float s = gi[r];
      for (int32_t k = row_ptr[r]; k < row_ptr[r + 1]; ++k) {
        dw[k] += s * xi[col[k]];
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dynmo::kernels
