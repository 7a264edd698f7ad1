// The checkpoint manifest (trainer/state/checkpoint_manifest.h): it round-trips
// through JSON, says exactly which model flags differ from a resuming job,
// refuses a different global batch or a finished run, and the newest
// complete checkpoint is found while incomplete ones are skipped.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/state/checkpoint_manifest.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

TrainerConfig Job() {
  TrainerConfig c;
  c.model.num_blocks = 4;
  c.steps = 10;
  c.pp = 2;
  c.dp = 2;
  c.microbatches = 2;
  c.micro_batch = 4;
  c.data = "corpus.txt";
  return c;
}

TEST(CheckpointManifestTest, RoundTripsThroughJson) {
  const CheckpointManifest m = ManifestFor(Job(), 6, {0, 2, 6});
  absl::StatusOr<CheckpointManifest> back = ParseManifest(ManifestToJson(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->iteration, 6);
  EXPECT_EQ(back->num_layers, 6);
  EXPECT_EQ(back->global_batch_samples, 16);
  EXPECT_EQ(back->samples_consumed, 96);
  EXPECT_EQ(back->saved_pp, 2);
  EXPECT_EQ(back->saved_boundaries, (core::Boundaries{0, 2, 6}));
  EXPECT_EQ(back->data, "corpus.txt");
  EXPECT_FALSE(ParseManifest("{}").ok());
  EXPECT_THAT(ParseManifest("[1]").status().message(), HasSubstr("not a JSON object"));
}

TEST(CheckpointManifestTest, ResumesAtAnyShapeWithTheSameModelAndGlobalBatch) {
  const CheckpointManifest m = ManifestFor(Job(), 6, {0, 2, 6});
  TrainerConfig other = Job();
  other.pp = 3;
  other.dp = 1;
  other.microbatches = 4;  // 1 x 4 x 4 = the same 16 samples
  EXPECT_TRUE(CheckResumable(m, other).ok());

  other = Job();
  other.model.hidden = 128;
  other.model.vocab = 512;
  absl::Status s = CheckResumable(m, other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--hidden=64 (this job: 128)"));
  EXPECT_THAT(s.message(), HasSubstr("--vocab=256 (this job: 512)"));

  other = Job();
  other.dp = 1;
  EXPECT_THAT(CheckResumable(m, other).message(), HasSubstr("global batch of 16"));
  other = Job();
  other.steps = 6;
  EXPECT_THAT(CheckResumable(m, other).message(), HasSubstr("nothing left of --steps=6"));
}

TEST(CheckpointManifestTest, FindsTheNewestCompleteCheckpoint) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/ckpt_manifest_", getpid());
  EXPECT_THAT(FindLatestCheckpoint(root).status().message(), HasSubstr("no such directory"));
  mkdir(root.c_str(), 0755);
  EXPECT_THAT(FindLatestCheckpoint(root).status().message(),
              HasSubstr("holds no complete checkpoint"));
  for (int k : {2, 10, 4}) {
    mkdir(CheckpointDir(root, k).c_str(), 0755);
    ASSERT_TRUE(WriteManifest(CheckpointDir(root, k), ManifestFor(Job(), k, {0, 3, 6})).ok());
  }
  mkdir(CheckpointDir(root, 12).c_str(), 0755);  // no manifest: incomplete
  mkdir(CheckpointDir(root, 11).c_str(), 0755);
  std::ofstream(ManifestPath(CheckpointDir(root, 11))) << "{not json";
  absl::StatusOr<FoundCheckpoint> found = FindLatestCheckpoint(root);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->dir, CheckpointDir(root, 10));
  EXPECT_EQ(found->manifest.iteration, 10);
}

}  // namespace
}  // namespace dynmo::trainer
