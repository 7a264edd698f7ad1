// What one rank honestly reports about its GPU's memory (issue 26): the
// arithmetic, without LibTorch, so it is tested on CPU.
//
//   sharing  = the local ranks that ResolveDevice maps onto the same device
//              (local rank r uses device r % visible)
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
#include <cstdint>

namespace dynmo::trainer {

// Local ranks on device `index` of `visible`, with `local_world_size` local
// ranks spread round-robin; at least 1.
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
