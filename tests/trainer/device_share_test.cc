// Honest GPU memory (trainer/comm/device_share.h): the ranks sharing a
// device (by UUID, else round robin), capacity divided among them, and
// "used" as the reserved peak plus a share of what no caching allocator
// tracks.
#include "trainer/comm/device_share.h"

#include <vector>

#include "gtest/gtest.h"

namespace dynmo::trainer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A UUID whose bytes are all `b` (0: unknown).
DeviceUuid Uuid(uint8_t b) {
  DeviceUuid u;
  u.fill(b);
  return u;
}

std::vector<int> SharingOfEveryRank(const std::vector<DeviceUuid>& uuids) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(uuids.size()); ++r) {
    out.push_back(RanksOnSameDevice(uuids, r));
  }
  return out;
}

TEST(DeviceShareTest, PerTaskBindingGivesEveryRankItsOwnGpuThoughEachSeesCuda0) {
  // Slurm's --gpus-per-task=1: four ranks on a node, four GPUs, each rank
  // sees one device, index 0. Round robin would put all four on cuda:0.
  EXPECT_EQ(RanksSharingDevice(4, 1, 0), 4);
  EXPECT_EQ(SharingOfEveryRank({Uuid(1), Uuid(2), Uuid(3), Uuid(4)}),
            (std::vector<int>{1, 1, 1, 1}));
}

TEST(DeviceShareTest, RanksWithTheSameUuidShareTheDevice) {
  EXPECT_EQ(SharingOfEveryRank({Uuid(7), Uuid(7)}), (std::vector<int>{2, 2}));
  // Two nodes: three ranks on one GPU, one alone, two on another, and two
  // CPU ranks (no UUID), which share nothing.
  EXPECT_EQ(SharingOfEveryRank({Uuid(1), Uuid(1), Uuid(2), Uuid(1), Uuid(3), Uuid(3), Uuid(0),
                                Uuid(0)}),
            (std::vector<int>{3, 3, 1, 3, 2, 2, 1, 1}));
  // UUIDs that differ in one byte are different devices.
  DeviceUuid other = Uuid(1);
  other[15] = 2;
  EXPECT_EQ(SharingOfEveryRank({Uuid(1), other}), (std::vector<int>{1, 1}));
  EXPECT_FALSE(IsKnown(Uuid(0)));
  EXPECT_TRUE(IsKnown(other));
  // Nonsense in, one rank out.
  EXPECT_EQ(RanksOnSameDevice({}, 0), 1);
  EXPECT_EQ(RanksOnSameDevice({Uuid(1)}, 1), 1);
  EXPECT_EQ(RanksOnSameDevice({Uuid(1)}, -1), 1);
}

TEST(DeviceShareTest, WithoutUuidsLocalRanksSpreadRoundRobinOverTheVisibleDevices) {
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
