// What one rank honestly reports about its GPU's memory (issues 26, 39): the
// arithmetic, without LibTorch, so it is tested on CPU.
//
//   sharing  = the ranks computing on this rank's device, found by device
//              identity: every rank's CUDA device UUID, gathered once at
//              start (device.h), counted where it equals this rank's. Under
//              Slurm's per-task binding each rank sees only its own GPU, as
//              cuda:0, so the visible index says nothing about sharing.
//              Where no UUID is known (a build without the CUDA runtime),
//              the round-robin guess: local rank r on device r % visible.
//   capacity = the device's total / sharing
//   used     = the peak PyTorch's caching allocator reserved since the last
//              report (cached-but-free blocks included: the allocator does
//              not give them back, so another layer cannot have them)
//            + this rank's share of what the device holds outside every
//              caching allocator (the CUDA context, NCCL's buffers, cuBLAS
//              workspaces): (total - free) - reserved x sharing, over
//              sharing (ranks sharing a device are assumed to cache alike;
//              never below 0)
//
// Pure; thread-safe.
#ifndef DYNMO_TRAINER_COMM_DEVICE_SHARE_H_
#define DYNMO_TRAINER_COMM_DEVICE_SHARE_H_

#include <algorithm>
#include <array>
#include <cstdint>

#include "absl/types/span.h"

namespace dynmo::trainer {

// A device's identity: the 16 bytes of its CUDA UUID (cudaDeviceProp::uuid,
// the GPU-... of nvidia-smi -L; a MIG instance has its own). All zero: none
// known (a CPU rank).
using DeviceUuid = std::array<uint8_t, 16>;

inline bool IsKnown(const DeviceUuid& uuid) {
  return std::any_of(uuid.begin(), uuid.end(), [](uint8_t b) { return b != 0; });
}

// Ranks whose device is rank `rank`'s, itself included, from every rank's
// UUID in rank order; 1 when its own is unknown or `rank` is out of range.
inline int RanksOnSameDevice(absl::Span<const DeviceUuid> uuids, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= uuids.size() || !IsKnown(uuids[rank])) return 1;
  return static_cast<int>(std::count(uuids.begin(), uuids.end(), uuids[rank]));
}

// The fallback without UUIDs: local ranks on device `index` of `visible`,
// with `local_world_size` local ranks spread round-robin; at least 1.
inline int RanksSharingDevice(int local_world_size, int visible, int index) {
  if (visible <= 0 || local_world_size <= 0 || index < 0 || index >= visible) return 1;
  const int n = (local_world_size - 1 - index) / visible + 1;
  return std::max(1, local_world_size > index ? n : 1);
}

struct DeviceReading {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
  int64_t reserved_bytes = 0;       // this process's caching allocator, now
  int64_t peak_reserved_bytes = 0;  // ... its peak since the last reset
};

struct RankMemory {
  int64_t used_bytes = 0;
  int64_t capacity_bytes = 0;
};

inline RankMemory HonestRankMemory(const DeviceReading& r, int sharing) {
  const int64_t s = std::max(1, sharing);
  const int64_t outside = r.total_bytes - r.free_bytes - r.reserved_bytes * s;
  RankMemory m;
  m.capacity_bytes = r.total_bytes / s;
  m.used_bytes = r.peak_reserved_bytes + std::max<int64_t>(0, outside) / s;
  return m;
}

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_COMM_DEVICE_SHARE_H_
