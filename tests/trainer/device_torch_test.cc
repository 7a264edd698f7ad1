// Device placement and sharing (trainer/comm/device.h), per-layer clocks
// (trainer/stage/layer_clock.h) and a layer's resident bytes
// (trainer/stage/stage_memory.h). What needs a GPU runs only where LibTorch sees
// one and is skipped with a message elsewhere (CI has none); the rest runs
// on every machine.
#include <time.h>
#include <torch/cuda.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/comm/device.h"
#include "trainer/comm/process_group_transport.h"
#include "trainer/stage/layer_clock.h"
#include "trainer/stage/stage_memory.h"
#include "trainer/state/layer_state.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

bool HaveCuda() { return torch::cuda::device_count() > 0; }

#define SKIP_WITHOUT_CUDA()                                                   \
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device visible to LibTorch: the " \
                                   "GPU path runs in scripts/gpu-check.sh"

TrainerConfig TinyConfig(const std::string& device) {
  TrainerConfig c;
  c.model.num_blocks = 2;
  c.model.hidden = 16;
  c.model.heads = 2;
  c.model.seq_len = 8;
  c.model.vocab = 32;
  c.lr = 0.01;
  c.device = device;
  return c;
}

TEST(DeviceTest, CpuIsAlwaysThereAndAutoFollowsTheVisibleDevices) {
  absl::StatusOr<torch::Device> cpu = ResolveDevice("cpu", 3);
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->is_cpu());
  absl::StatusOr<torch::Device> automatic = ResolveDevice("auto", 0);
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->is_cuda(), HaveCuda());
}

TEST(DeviceTest, CudaWithoutADeviceIsAClearError) {
  if (HaveCuda()) GTEST_SKIP() << "a CUDA device is visible";
  absl::StatusOr<torch::Device> d = ResolveDevice("cuda", 0);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(d.status().message(), HasSubstr("no CUDA device"));
  EXPECT_THAT(d.status().message(), HasSubstr("--device=cpu"));
}

TEST(DeviceTest, CudaMeansThisLocalRanksDevice) {
  SKIP_WITHOUT_CUDA();
  const int n = static_cast<int>(torch::cuda::device_count());
  absl::StatusOr<torch::Device> d = ResolveDevice("cuda", n + 1);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index(), (n + 1) % n);
  EXPECT_FALSE(ResolveDevice(absl::StrCat("cuda:", n), 0).ok());
}

TEST(DeviceTest, ConfigNamesTheDevice) {
  EXPECT_TRUE(DeviceOf(TinyConfig("cpu")).is_cpu());
  EXPECT_TRUE(DeviceOf(TinyConfig("auto")).is_cpu()) << "unresolved auto builds on cpu";
  EXPECT_EQ(DeviceOf(TinyConfig("cuda:1")), torch::Device(torch::kCUDA, 1));
  TrainerConfig bad = TinyConfig("gpu");
  absl::Status s = ValidateConfig(bad, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("--device must be auto, cpu, cuda or cuda:N"));
  bad = TinyConfig("cpu");
  bad.layer_clock = "sundial";
  EXPECT_THAT(ValidateConfig(bad, 1).message(), HasSubstr("--layer_clock"));
}

TEST(DeviceTest, CpuHasNoAllocatorBytes) {
  const DeviceMemory m = ReadDeviceMemory(torch::Device(torch::kCPU));
  EXPECT_EQ(m.allocated_bytes, 0);
  EXPECT_EQ(m.total_bytes, 0);
}

// Runs body(rank, transport) on every rank of a Gloo world of `n` at once,
// one thread per rank over one in-process store.
void OnGlooWorld(int n, const std::function<void(int, Transport&)>& body) {
  auto backend = std::make_shared<ProcessGroupBackend>();
  backend->name = "gloo";
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  backend->make_group = [options](c10::intrusive_ptr<c10d::Store> s, int rank, int size) {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(std::move(s), rank, size, options);
  };
  backend->timeout = std::chrono::seconds(30);
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto run = [&](int rank) {
    absl::StatusOr<std::unique_ptr<Transport>> t =
        ConnectProcessGroups(backend, store, -1, rank, n, 1, 0);
    ASSERT_TRUE(t.ok()) << t.status();
    body(rank, **t);
  };
  std::vector<std::thread> peers;
  for (int r = 1; r < n; ++r) peers.emplace_back(run, r);
  run(0);
  for (std::thread& p : peers) p.join();
}

TEST(DeviceTest, EveryRanksUuidIsGatheredInRankOrder) {
  // Ranks 0 and 1 on one GPU, rank 2 on another: what each rank learns.
  auto uuid = [](int rank) {
    DeviceUuid u{};
    u[0] = rank < 2 ? 0xA1 : 0xB2;
    u[15] = 0x5C;
    return u;
  };
  std::vector<std::vector<DeviceUuid>> seen(3);
  std::vector<int> sharing(3, 0), cpu_sharing(3, 0);
  OnGlooWorld(3, [&](int rank, Transport& transport) {
    absl::StatusOr<std::vector<DeviceUuid>> all = GatherDeviceUuids(uuid(rank), transport);
    ASSERT_TRUE(all.ok()) << all.status();
    seen[rank] = *all;
    sharing[rank] = RanksOnSameDevice(*all, rank);
    // The trainer's call: on the cpu it shares nothing, but still takes part.
    absl::StatusOr<int> cpu = RanksSharingThisDevice(torch::Device(torch::kCPU), transport);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_sharing[rank] = *cpu;
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(seen[r], (std::vector<DeviceUuid>{uuid(0), uuid(1), uuid(2)})) << "rank " << r;
  }
  EXPECT_EQ(sharing, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(cpu_sharing, (std::vector<int>{1, 1, 1}));
  EXPECT_FALSE(IsKnown(ReadDeviceUuid(torch::Device(torch::kCPU))));
  EXPECT_EQ(ReadRankMemory(torch::Device(torch::kCPU), 2).capacity_bytes, 0);
}

TEST(DeviceTest, TheCudaRuntimeNamesEveryVisibleGpuApart) {
  SKIP_WITHOUT_CUDA();
  std::vector<DeviceUuid> uuids;
  for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i) {
    uuids.push_back(ReadDeviceUuid(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(i))));
    EXPECT_TRUE(IsKnown(uuids.back())) << "cuda:" << i;
  }
  for (int i = 0; i < static_cast<int>(uuids.size()); ++i) {
    EXPECT_EQ(RanksOnSameDevice(uuids, i), 1) << "cuda:" << i;
  }
}

int64_t Bytes(const torch::Tensor& t) { return t.numel() * t.element_size(); }

TEST(StageMemoryTest, ResidentBytesHoldTheGradientsAZeroGradFreed) {
  OwnedLayer owned = MakeOwnedLayer(TinyConfig("cpu"), 1);  // a decoder block
  int64_t params = 0, buffers = 0;
  for (const torch::Tensor& p : owned.layer->parameters()) params += Bytes(p);
  for (const torch::Tensor& b : owned.layer->buffers()) buffers += Bytes(b);
  ASSERT_GT(params, 0);
  // Before the first backward no gradient is allocated: counted all the same.
  EXPECT_EQ(LayerResidentBytes(owned), 2 * params + buffers);

  torch::manual_seed(3);
  MicroBatchContext ctx;
  owned.layer->Forward(torch::randn({2, 8, 16}), ctx).pow(2).mean().backward();
  EXPECT_EQ(LayerResidentBytes(owned), 2 * params + buffers) << "allocated now";
  owned.optimizer->step();
  owned.optimizer->zero_grad();  // set_to_none: every gradient freed
  for (const torch::Tensor& p : owned.layer->parameters()) ASSERT_FALSE(p.grad().defined());
  // + exp_avg and exp_avg_sq per parameter (AdamW's step is not a tensor).
  EXPECT_EQ(LayerResidentBytes(owned), 4 * params + buffers);

  // A frozen parameter has no gradient to hold.
  for (torch::Tensor& p : owned.layer->parameters()) p.set_requires_grad(false);
  EXPECT_EQ(LayerResidentBytes(owned), 3 * params + buffers);
}

// Work between Start and Stop shows up in the slot; no bound on how much.
TEST(LayerClockTest, EveryCpuClockAddsItsSpanToItsSlot) {
  for (int id : {-1, static_cast<int>(CLOCK_THREAD_CPUTIME_ID)}) {
    LayerClock clock(torch::Device(torch::kCPU), id);
    double slot = 0;
    const LayerClock::Span span = clock.Start();
    torch::Tensor x = torch::randn({128, 128});
    for (int i = 0; i < 20; ++i) x = torch::tanh(x.matmul(x));
    clock.Stop(span, &slot);
    EXPECT_GT(slot, 0) << "clock " << id;
    const double before = slot;
    clock.Collect();
    EXPECT_EQ(slot, before) << "cpu spans are added at Stop";
  }
}

TEST(LayerClockTest, CudaEventsAreReadOnceAtCollect) {
  SKIP_WITHOUT_CUDA();
  const torch::Device gpu(torch::kCUDA, 0);
  LayerClock clock(gpu);
  double first = 0, second = 0;
  torch::Tensor x = torch::randn({1024, 1024}, torch::TensorOptions().device(gpu));
  LayerClock::Span a = clock.Start();
  x = x.matmul(x);
  clock.Stop(a, &first);
  LayerClock::Span b = clock.Start();
  x = x.matmul(x);
  clock.Stop(b, &second);
  EXPECT_EQ(first, 0) << "nothing is read before Collect";
  clock.Collect();
  EXPECT_GT(first, 0);
  EXPECT_GT(second, 0);
  clock.Collect();  // nothing pending: a no-op
}

TEST(DeviceTest, AStateCapturedOnCpuRestoresOntoTheGpuAndTrainsAlike) {
  SKIP_WITHOUT_CUDA();
  const TrainerConfig cpu_config = TinyConfig("cpu");
  const TrainerConfig gpu_config = TinyConfig("cuda:0");
  OwnedLayer cpu = MakeOwnedLayer(cpu_config, 1);
  auto step = [](OwnedLayer& owned, torch::Device d) {
    torch::manual_seed(11);
    torch::Tensor x = torch::randn({2, 8, 16}).to(d);
    MicroBatchContext ctx;
    owned.optimizer->zero_grad();
    owned.layer->Forward(x, ctx).pow(2).mean().backward();
    owned.optimizer->step();
  };
  step(cpu, torch::kCPU);
  absl::StatusOr<OwnedLayer> gpu = RestoreLayer(gpu_config, CaptureLayerState(cpu));
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  for (const auto& p : gpu->layer->parameters()) EXPECT_TRUE(p.is_cuda());
  step(cpu, torch::kCPU);
  step(*gpu, torch::Device("cuda:0"));
  // The layers compute the same function after the step: outputs agree
  // closely. Parameters agree within one AdamW step: a gradient that is zero
  // in exact arithmetic (the key part of qkv.bias: softmax ignores a shift
  // shared by every key) is rounding noise on both devices, and AdamW's
  // normalised step turns noise of either sign into about lr either way: 2 lr
  // apart at most (on the H100 of the first GPU check, attention.qkv.bias
  // alone differed at 1e-4).
  torch::manual_seed(12);
  const torch::Tensor probe = torch::randn({2, 8, 16});
  MicroBatchContext ctx_cpu, ctx_gpu;
  const torch::Tensor out_cpu = cpu.layer->Forward(probe, ctx_cpu).detach();
  const torch::Tensor out_gpu =
      gpu->layer->Forward(probe.to(torch::Device("cuda:0")), ctx_gpu).detach().cpu();
  EXPECT_TRUE(torch::allclose(out_cpu, out_gpu, 1e-4, 1e-4))
      << "max |diff| " << (out_cpu - out_gpu).abs().max().item<double>();
  const double two_steps = 2 * cpu_config.lr;
  auto pc = cpu.layer->named_parameters(), pg = gpu->layer->named_parameters();
  for (const auto& item : pc) {
    EXPECT_TRUE(torch::allclose(item.value(), pg.find(item.key())->cpu(), 1e-4, two_steps))
        << item.key();
  }
  const DeviceMemory m = ReadDeviceMemory(torch::Device("cuda:0"));
  EXPECT_GT(m.allocated_bytes, 0);
  EXPECT_GT(m.total_bytes, m.allocated_bytes);
}

}  // namespace
}  // namespace dynmo::trainer
