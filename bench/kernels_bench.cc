// dynmo-bench-kernels: does a pruned linear layer really run faster than a
// dense one on the CPU? CSR SpMM (kernels/csr_spmm_cpu.h) at 0..95% sparsity
// against a dense kernel of the same shape, n = 512 samples, in = out = 512,
// for the forward pass and both backward products.
//
// The dense baselines are written in the axpy form (a scalar times a
// contiguous row, added to a contiguous row) with __restrict__ pointers, which
// gcc -O2 vectorizes without -ffast-math, and process 4 samples per sweep of W
// like the sparse kernels do: a tight dense loop, not a tuned BLAS. Results and the command:
// docs/benchmarks.md ("CPU CSR SpMM vs dense").
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/csr_matrix.h"
#include "kernels/csr_spmm_cpu.h"

namespace dynmo::kernels {
namespace {

constexpr int64_t kN = 512, kIn = 512, kOut = 512;

std::vector<float> Random(int64_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> m(static_cast<size_t>(size));
  for (float& x : m) x = dist(rng);
  return m;
}

CsrMatrix PrunedWeight(int percent_sparse) {
  std::vector<float> w = Random(kOut * kIn, 1);
  std::mt19937_64 rng(2);
  std::uniform_int_distribution<int> u(0, 99);
  std::vector<uint8_t> keep(w.size());
  for (uint8_t& k : keep) k = u(rng) >= percent_sparse ? 1 : 0;
  return *CsrMatrix::FromDenseMask(w, keep, kOut, kIn);
}

// y [n, out] = x [n, in] · w, w given transposed as wt [in, out].
void DenseForward(const float* __restrict__ wt, const float* __restrict__ x,
                  float* __restrict__ y) {
  for (int64_t i = 0; i < kN; i += 4) {
    float* y0 = y + i * kOut;
    std::fill(y0, y0 + 4 * kOut, 0.0f);
    for (int64_t c = 0; c < kIn; ++c) {
      const float a0 = x[i * kIn + c], a1 = x[(i + 1) * kIn + c],
                  a2 = x[(i + 2) * kIn + c], a3 = x[(i + 3) * kIn + c];
      const float* wr = wt + c * kOut;
      for (int64_t r = 0; r < kOut; ++r) {
        y0[r] += a0 * wr[r];
        y0[kOut + r] += a1 * wr[r];
        y0[2 * kOut + r] += a2 * wr[r];
        y0[3 * kOut + r] += a3 * wr[r];
      }
    }
  }
}

// dx [n, in] = dy [n, out] · w [out, in].
void DenseBackwardInput(const float* __restrict__ w,
                        const float* __restrict__ dy, float* __restrict__ dx) {
  for (int64_t i = 0; i < kN; i += 4) {
    float* d0 = dx + i * kIn;
    std::fill(d0, d0 + 4 * kIn, 0.0f);
    for (int64_t r = 0; r < kOut; ++r) {
      const float s0 = dy[i * kOut + r], s1 = dy[(i + 1) * kOut + r],
                  s2 = dy[(i + 2) * kOut + r], s3 = dy[(i + 3) * kOut + r];
      const float* wr = w + r * kIn;
      for (int64_t c = 0; c < kIn; ++c) {
        d0[c] += s0 * wr[c];
        d0[kIn + c] += s1 * wr[c];
        d0[2 * kIn + c] += s2 * wr[c];
        d0[3 * kIn + c] += s3 * wr[c];
      }
    }
  }
}

// dw [out, in] = dyᵀ · x.
void DenseBackwardWeight(const float* __restrict__ dy,
                         const float* __restrict__ x, float* __restrict__ dw) {
  std::fill(dw, dw + kOut * kIn, 0.0f);
  for (int64_t i = 0; i < kN; i += 4) {
    for (int64_t r = 0; r < kOut; ++r) {
      const float s0 = dy[i * kOut + r], s1 = dy[(i + 1) * kOut + r],
                  s2 = dy[(i + 2) * kOut + r], s3 = dy[(i + 3) * kOut + r];
      float* dr = dw + r * kIn;
      const float* x0 = x + i * kIn;
      for (int64_t c = 0; c < kIn; ++c) {
        dr[c] += s0 * x0[c] + s1 * x0[kIn + c] + s2 * x0[2 * kIn + c] +
                 s3 * x0[3 * kIn + c];
      }
    }
  }
}

void SetCounters(benchmark::State& state, int64_t multiply_adds) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * multiply_adds, benchmark::Counter::kIsIterationInvariantRate,
      benchmark::Counter::kIs1000);
}

void BM_DenseForward(benchmark::State& state) {
  std::vector<float> wt = Random(kIn * kOut, 1), x = Random(kN * kIn, 3),
                     y(kN * kOut);
  for (auto _ : state) {
    DenseForward(wt.data(), x.data(), y.data());
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(state, kN * kIn * kOut);
}

void BM_CsrForward(benchmark::State& state) {
  const CsrMatrix w = PrunedWeight(static_cast<int>(state.range(0)));
  std::vector<float> x = Random(kN * kIn, 3), y(kN * kOut);
  for (auto _ : state) {
    benchmark::DoNotOptimize(CsrLinearForward(w, x, kN, {}, absl::MakeSpan(y)));
    benchmark::DoNotOptimize(y.data());
  }
  SetCounters(state, kN * w.nnz());
}

void BM_DenseBackwardInput(benchmark::State& state) {
  std::vector<float> w = Random(kOut * kIn, 1), dy = Random(kN * kOut, 4),
                     dx(kN * kIn);
  for (auto _ : state) {
    DenseBackwardInput(w.data(), dy.data(), dx.data());
    benchmark::DoNotOptimize(dx.data());
  }
  SetCounters(state, kN * kIn * kOut);
}

void BM_CsrBackwardInput(benchmark::State& state) {
  const CsrMatrix w = PrunedWeight(static_cast<int>(state.range(0)));
  std::vector<float> dy = Random(kN * kOut, 4), dx(kN * kIn);
  for (auto _ : state) {
    benchmark::DoNotOptimize(CsrLinearBackwardInput(w, dy, kN, absl::MakeSpan(dx)));
    benchmark::DoNotOptimize(dx.data());
  }
  SetCounters(state, kN * w.nnz());
}

void BM_DenseBackwardWeight(benchmark::State& state) {
  std::vector<float> dy = Random(kN * kOut, 4), x = Random(kN * kIn, 3),
                     dw(kOut * kIn);
  for (auto _ : state) {
    DenseBackwardWeight(dy.data(), x.data(), dw.data());
    benchmark::DoNotOptimize(dw.data());
  }
  SetCounters(state, kN * kIn * kOut);
}

void BM_CsrBackwardWeight(benchmark::State& state) {
  const CsrMatrix w = PrunedWeight(static_cast<int>(state.range(0)));
  std::vector<float> dy = Random(kN * kOut, 4), x = Random(kN * kIn, 3),
                     dw(w.nnz());
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        CsrLinearBackwardWeight(w, dy, x, kN, absl::MakeSpan(dw)));
    benchmark::DoNotOptimize(dw.data());
  }
  SetCounters(state, kN * w.nnz());
}

// Argument: percent of W's entries pruned.
#define DYNMO_SPARSITIES ->Arg(0)->Arg(50)->Arg(75)->Arg(90)->Arg(95)->Unit(benchmark::kMillisecond)
BENCHMARK(BM_DenseForward)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CsrForward) DYNMO_SPARSITIES;
BENCHMARK(BM_DenseBackwardInput)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CsrBackwardInput) DYNMO_SPARSITIES;
BENCHMARK(BM_DenseBackwardWeight)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CsrBackwardWeight) DYNMO_SPARSITIES;

}  // namespace
}  // namespace dynmo::kernels

BENCHMARK_MAIN();
