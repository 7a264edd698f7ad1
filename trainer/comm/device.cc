#include "trainer/comm/device.h"

#include <ATen/DeviceAccelerator.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/comm/dist_env.h"

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

RankMemory ReadRankMemory(torch::Device device) {
  if (!IsCuda(device)) return RankMemory{};
  const DeviceMemory m = ReadDeviceMemory(device);
  const int sharing = RanksSharingDevice(
      LocalRanks(ProcessEnv()), static_cast<int>(torch::cuda::device_count()), device.index());
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
