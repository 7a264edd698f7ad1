// dynmo-bench-balance: how long the partitioners take at cluster scale.
// Targets (issue 2): `optimal` with memory caps, 1,024 layers on 64 stages in
// <= 1 ms and 100,000 layers on 1,024 stages in <= 100 ms on a 2-core machine.
#include <benchmark/benchmark.h>

#include <random>

#include "core/partition.h"
#include "core/repack.h"

namespace dynmo::core {
namespace {

// Layers with lognormal times (a few heavy outliers, as after pruning or
// freezing), varied sizes, and caps at 1.5x a fair share of memory, with a
// current layout to break ties against.
PipelineModel RandomModel(int layers, int stages, bool caps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> time(0.0, 0.5);
  std::uniform_int_distribution<int64_t> bytes(50 << 20, 150 << 20);
  PipelineModel m;
  int64_t total = 0;
  for (int i = 0; i < layers; ++i) {
    LayerCost l;
    l.id = i;
    l.fwd_s = time(rng) * 1e-3;
    l.bwd_s = 2 * l.fwd_s;
    l.resident_bytes = bytes(rng);
    total += l.resident_bytes;
    m.layers.push_back(l);
  }
  m.stages.assign(stages, StageSpec{});
  if (caps) {
    for (auto& s : m.stages) s.capacity_bytes = total / stages * 3 / 2;
  }
  return m;
}

void BM_Optimal(benchmark::State& state) {
  const int layers = static_cast<int>(state.range(0));
  const int stages = static_cast<int>(state.range(1));
  const bool caps = state.range(2) != 0;
  PipelineModel m = RandomModel(layers, stages, caps, 42);
  const Boundaries current = PartitionUniform(layers, stages);
  for (auto _ : state) {
    auto b = PartitionOptimal(m, &current);
    if (!b.ok()) state.SkipWithError(std::string(b.status().message()).c_str());
    benchmark::DoNotOptimize(b);
  }
  state.SetLabel(caps ? "caps" : "no caps");
}
BENCHMARK(BM_Optimal)
    ->Args({1024, 64, 1})
    ->Args({1024, 64, 0})
    ->Args({100000, 1024, 1})
    ->Args({100000, 1024, 0})
    ->Unit(benchmark::kMillisecond);

void BM_OptimalHeterogeneous(benchmark::State& state) {
  const int layers = static_cast<int>(state.range(0));
  const int stages = static_cast<int>(state.range(1));
  PipelineModel m = RandomModel(layers, stages, true, 7);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> speed(0.5, 1.5);
  for (auto& s : m.stages) s.speed = speed(rng);
  const Boundaries current = PartitionUniform(layers, stages);
  for (auto _ : state) {
    auto b = PartitionOptimal(m, &current);
    if (!b.ok()) state.SkipWithError(std::string(b.status().message()).c_str());
    benchmark::DoNotOptimize(b);
  }
}
BENCHMARK(BM_OptimalHeterogeneous)
    ->Args({1024, 64})
    ->Args({100000, 1024})
    ->Unit(benchmark::kMillisecond);

void BM_Method(benchmark::State& state) {
  const auto method = static_cast<PartitionMethod>(state.range(0));
  PipelineModel m = RandomModel(1024, 64, false, 3);
  PartitionOptions o;
  o.method = method;
  for (auto _ : state) {
    auto r = Partition(m, o);
    benchmark::DoNotOptimize(r);
  }
  state.SetLabel(PartitionMethodName(method));
}
BENCHMARK(BM_Method)
    ->Arg(static_cast<int>(PartitionMethod::kUniform))
    ->Arg(static_cast<int>(PartitionMethod::kTime))
    ->Arg(static_cast<int>(PartitionMethod::kDiffusion))
    ->Unit(benchmark::kMillisecond);

void BM_RepackOptimal(benchmark::State& state) {
  const int layers = static_cast<int>(state.range(0));
  const int stages = static_cast<int>(state.range(1));
  PipelineModel m = RandomModel(layers, stages, true, 11);
  for (auto _ : state) {
    auto r = RepackOptimal(m, RepackOptions{});
    benchmark::DoNotOptimize(r);
  }
}
BENCHMARK(BM_RepackOptimal)->Args({48, 24})->Args({1024, 64})->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dynmo::core

BENCHMARK_MAIN();
