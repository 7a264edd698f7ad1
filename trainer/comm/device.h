// Device placement for dynmo-train: which torch::Device a rank computes on
// and what that device says about its memory.
//
// --device=auto picks cuda when LibTorch sees a CUDA device, else cpu;
// "cuda" means cuda:(LOCAL_RANK mod visible devices), so one process per
// GPU as torchrun starts them (and, on a one-GPU machine, every local rank
// on cuda:0). Everything here goes through ATen's device-generic
// accelerator API, so this file compiles and links against any LibTorch and
// its CUDA branches run only where a GPU is; only the device's UUID comes
// from the CUDA runtime, in builds against a CUDA LibTorch. Thread-
// compatible functions.
#ifndef DYNMO_TRAINER_COMM_DEVICE_H_
#define DYNMO_TRAINER_COMM_DEVICE_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/comm/device_share.h"
#include "trainer/config/config.h"

namespace dynmo::trainer {

class Transport;

// The concrete device for `flag` (auto|cpu|cuda|cuda:N) on local rank
// `local_rank`; FAILED_PRECONDITION when cuda is asked for and none is
// visible (or cuda:N names one that is not).
absl::StatusOr<torch::Device> ResolveDevice(absl::string_view flag, int local_rank);

// The device config.device names once resolved ("cpu" or "cuda:N"); "auto"
// (unresolved, as in-process tests build layers) means cpu.
torch::Device DeviceOf(const TrainerConfig& config);

// Makes `device` the current device of this thread (a no-op for cpu).
void UseDevice(torch::Device device);

// Bytes of the caching allocator on `device`: what live tensors hold now,
// what the allocator reserved from the device (live + cached), the peaks
// of both since the last ResetPeakDeviceMemory, and the device's free and
// total memory (cudaMemGetInfo: every process and the context included).
// All zero on cpu.
struct DeviceMemory {
  int64_t allocated_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
DeviceMemory ReadDeviceMemory(torch::Device device);
void ResetPeakDeviceMemory(torch::Device device);

// This rank's device UUID (cudaDeviceProp::uuid); all zero on cpu, or in a
// build against a LibTorch without CUDA.
DeviceUuid ReadDeviceUuid(torch::Device device);

// Every rank's `mine`, in rank order: one world all-gather of 16 bytes over
// `transport` (a collective: every rank calls it, at the same point).
absl::StatusOr<std::vector<DeviceUuid>> GatherDeviceUuids(const DeviceUuid& mine,
                                                          Transport& transport);

// How many ranks compute on this rank's `device`, itself included
// (device_share.h): by UUID, gathered over `transport` — a collective every
// rank calls once after connecting, whatever its device; which ranks share
// a GPU does not change during a job. 1 on cpu. A cuda rank without a UUID
// (no CUDA runtime in the build) falls back to the round-robin guess from
// LocalRanks() and the visible devices, and says so on stderr.
absl::StatusOr<int> RanksSharingThisDevice(torch::Device device, Transport& transport);

// used / capacity as device_share.h computes them for this rank, with
// `sharing` from RanksSharingThisDevice. Zero on cpu.
RankMemory ReadRankMemory(torch::Device device, int sharing);

// Returns the caching allocator's unused blocks to the device (a released
// rank does this before it serves or exits). No-op on cpu.
void EmptyDeviceCache(torch::Device device);

// Waits until every kernel queued on `device` has finished (no-op on cpu).
void SynchronizeDevice(torch::Device device);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_COMM_DEVICE_H_
