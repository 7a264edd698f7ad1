#include "trainer/comm/device.h"

#include <ATen/DeviceAccelerator.h>
#include <torch/cuda.h>

// DYNMO_WITH_CUDA_RUNTIME: defined on this file when LibTorch has CUDA
// (trainer/CMakeLists.txt); its cudart is linked then.
#ifdef DYNMO_WITH_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/comm/dist_env.h"
#include "trainer/comm/transport.h"

namespace dynmo::trainer {
namespace {

bool IsCuda(torch::Device d) { return d.type() == torch::kCUDA; }

}  // namespace

absl::StatusOr<torch::Device> ResolveDevice(absl::string_view flag, int local_rank) {
  if (flag == "cpu") return torch::Device(torch::kCPU);
  const int visible = static_cast<int>(torch::cuda::device_count());
  if (flag == "auto" && visible == 0) return torch::Device(torch::kCPU);
  if (visible == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=", flag, " but LibTorch sees no CUDA device (CUDA_VISIBLE_DEVICES=",
        std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "unset",
        "); use --device=cpu"));
  }
  if (flag == "auto" || flag == "cuda") {
    const int index = local_rank < 0 ? 0 : local_rank % visible;
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  }
  if (IsCudaDeviceName(flag)) {
    const torch::Device d{std::string(flag)};
    if (d.index() >= visible) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--device=", flag, " but only ", visible, " CUDA device(s) are visible"));
    }
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be auto, cpu, cuda or cuda:N, not '", flag, "'"));
}

torch::Device DeviceOf(const TrainerConfig& config) {
  if (config.device == "cuda") return torch::Device(torch::kCUDA, 0);
  if (IsCudaDeviceName(config.device)) return torch::Device(config.device);
  return torch::Device(torch::kCPU);
}

void UseDevice(torch::Device device) {
  if (IsCuda(device)) at::accelerator::setDeviceIndex(device.index());
}

DeviceMemory ReadDeviceMemory(torch::Device device) {
  DeviceMemory m;
  if (!IsCuda(device)) return m;
  const auto stats = at::accelerator::getDeviceStats(device.index());
  // Index 0 aggregates every pool (c10::CachingDeviceAllocator::StatType).
  m.allocated_bytes = stats.allocated_bytes[0].current;
  m.peak_allocated_bytes = stats.allocated_bytes[0].peak;
  m.reserved_bytes = stats.reserved_bytes[0].current;
  m.peak_reserved_bytes = stats.reserved_bytes[0].peak;
  const std::pair<size_t, size_t> info = at::accelerator::getMemoryInfo(device.index());
  m.free_bytes = static_cast<int64_t>(info.first);
  m.total_bytes = static_cast<int64_t>(info.second);
  return m;
}

DeviceUuid ReadDeviceUuid(torch::Device device) {
  DeviceUuid uuid{};
#ifdef DYNMO_WITH_CUDA_RUNTIME
  if (IsCuda(device)) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) {
      static_assert(sizeof(prop.uuid.bytes) == sizeof(DeviceUuid));
      std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
    }
  }
#endif
  return uuid;
}

absl::StatusOr<std::vector<DeviceUuid>> GatherDeviceUuids(const DeviceUuid& mine,
                                                          Transport& transport) {
  torch::Tensor bytes = torch::empty({static_cast<int64_t>(mine.size())}, torch::kUInt8);
  std::copy(mine.begin(), mine.end(), bytes.data_ptr<uint8_t>());
  std::vector<torch::Tensor> gathered;
  // host-sync(event): once at start: every rank's device UUID, to count the ranks sharing a GPU
  if (absl::Status s = transport.AllGatherWorld(bytes, gathered); !s.ok()) return s;
  std::vector<DeviceUuid> uuids(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    const torch::Tensor t = gathered[r].contiguous();  // on the cpu: AllGatherWorld's contract
    std::copy_n(t.data_ptr<uint8_t>(), uuids[r].size(), uuids[r].begin());
  }
  return uuids;
}

absl::StatusOr<int> RanksSharingThisDevice(torch::Device device, Transport& transport) {
  const DeviceUuid mine = ReadDeviceUuid(device);
  int sharing = 1;
  if (transport.world_size() > 1) {
    absl::StatusOr<std::vector<DeviceUuid>> uuids = GatherDeviceUuids(mine, transport);
    if (!uuids.ok()) return uuids.status();
    sharing = RanksOnSameDevice(*uuids, transport.rank());
  }
  if (IsCuda(device) && !IsKnown(mine)) {
    sharing = RanksSharingDevice(LocalRanks(ProcessEnv()),
                                 static_cast<int>(torch::cuda::device_count()), device.index());
    std::cerr << "dynmo-train: rank " << transport.rank() << ": the CUDA runtime gave no UUID "
              << "for " << device.str() << "; assuming local ranks spread round-robin over "
              << "the visible GPUs: " << sharing << " on it" << std::endl;
  }
  return sharing;
}

RankMemory ReadRankMemory(torch::Device device, int sharing) {
  if (!IsCuda(device)) return RankMemory{};
  const DeviceMemory m = ReadDeviceMemory(device);
  return HonestRankMemory(
      DeviceReading{m.total_bytes, m.free_bytes, m.reserved_bytes, m.peak_reserved_bytes},
      sharing);
}

void EmptyDeviceCache(torch::Device device) {
  if (IsCuda(device)) at::accelerator::emptyCache();
}

void ResetPeakDeviceMemory(torch::Device device) {
  if (IsCuda(device)) at::accelerator::resetPeakStats(device.index());
}

void SynchronizeDevice(torch::Device device) {
  if (IsCuda(device)) at::accelerator::synchronizeDevice(device.index());
}

}  // namespace dynmo::trainer
