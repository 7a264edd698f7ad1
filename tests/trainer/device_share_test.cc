// Honest GPU memory (trainer/comm/device_share.h): the ranks sharing a
// device, capacity divided among them, and "used" as the reserved peak plus
// a share of what no caching allocator tracks.
#include "trainer/comm/device_share.h"

#include "gtest/gtest.h"

namespace dynmo::trainer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(DeviceShareTest, LocalRanksSpreadRoundRobinOverTheVisibleDevices) {
  EXPECT_EQ(RanksSharingDevice(8, 8, 3), 1);   // one rank per GPU
  EXPECT_EQ(RanksSharingDevice(4, 1, 0), 4);   // four ranks on one GPU
  EXPECT_EQ(RanksSharingDevice(5, 2, 0), 3);   // ranks 0, 2, 4
  EXPECT_EQ(RanksSharingDevice(5, 2, 1), 2);   // ranks 1, 3
  EXPECT_EQ(RanksSharingDevice(1, 8, 0), 1);
  // Nonsense in, one rank out (never a division by zero).
  EXPECT_EQ(RanksSharingDevice(0, 0, 0), 1);
  EXPECT_EQ(RanksSharingDevice(4, 2, 5), 1);
}

TEST(DeviceShareTest, UsedIsTheReservedPeakPlusAShareOfWhatNoAllocatorTracks) {
  // An 80 GiB GPU, 2 ranks on it, each with 30 GiB reserved now (peak 32);
  // 68 GiB in use on the device: 60 reserved + 8 outside (context, NCCL).
  const DeviceReading r{80 * kGiB, 12 * kGiB, 30 * kGiB, 32 * kGiB};
  const RankMemory m = HonestRankMemory(r, 2);
  EXPECT_EQ(m.capacity_bytes, 40 * kGiB);
  EXPECT_EQ(m.used_bytes, 32 * kGiB + 4 * kGiB);
  // Alone on the device it carries all of the untracked 38 GiB ...
  const RankMemory alone = HonestRankMemory(r, 1);
  EXPECT_EQ(alone.capacity_bytes, 80 * kGiB);
  EXPECT_EQ(alone.used_bytes, 32 * kGiB + 38 * kGiB);
  // ... and what others reserved beyond its guess never makes it negative.
  const RankMemory busy =
      HonestRankMemory(DeviceReading{80 * kGiB, 70 * kGiB, 9 * kGiB, 9 * kGiB}, 2);
  EXPECT_EQ(busy.used_bytes, 9 * kGiB);
}

}  // namespace
}  // namespace dynmo::trainer
