// dynmo-train's layout flags: the starting partition and the test policies
// that change it (migrations, re-packs, a re-shape).
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "trainer/layout/boundaries_text.h"
#include "trainer/layout/repack_layout.h"
#include "trainer/layout/reshape_layout.h"
#include "trainer/run/train_flags.h"

ABSL_FLAG(std::string, initial_boundaries, "",
          "starting partition b0,b1,...,bpp over the pipeline layers (default uniform)");
ABSL_FLAG(int, test_migrate_every, 0,
          "test policy: migrate every N iterations to the next of --test_migration_boundaries");
ABSL_FLAG(std::string, test_migration_boundaries, "",
          "test policy: ';'-separated partitions b0,...,bpp to cycle through; an "
          "entry 's0,s1,...@b0,...,bk' keeps only those original stages active "
          "(re-packing: the other stages' ranks are released)");
ABSL_FLAG(std::string, test_reshape_at, "",
          "test policy: ITER:PPxDP[:b0,b1,...] re-shapes the job's ranks into a PP x DP "
          "grid before iteration ITER (boundaries over PP stages; default uniform); the "
          "global batch stays, each replica running dp*microbatches/DP micro-batches");

namespace dynmo::trainer {

absl::Status ReadLayoutFlags(TrainerConfig& c) {
  if (std::string b = absl::GetFlag(FLAGS_initial_boundaries); !b.empty()) {
    absl::StatusOr<core::Boundaries> parsed = ParseBoundaries(b);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--initial_boundaries: ", parsed.status().message()));
    }
    c.initial_boundaries = *parsed;
  }
  c.test_migrate_every = absl::GetFlag(FLAGS_test_migrate_every);
  if (std::string list = absl::GetFlag(FLAGS_test_migration_boundaries); !list.empty()) {
    bool names_stages = false;
    for (absl::string_view entry : absl::StrSplit(list, ';')) {
      absl::StatusOr<LayoutTarget> parsed = ParseLayoutTarget(entry);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--test_migration_boundaries: ", parsed.status().message()));
      }
      c.test_migration_targets.push_back(parsed->boundaries);
      c.test_migration_stages.push_back(parsed->active_stages);
      names_stages = names_stages || !parsed->active_stages.empty();
    }
    if (!names_stages) c.test_migration_stages.clear();
  }
  if (std::string at = absl::GetFlag(FLAGS_test_reshape_at); !at.empty()) {
    absl::StatusOr<ReshapeAt> parsed = ParseReshapeAt(at);
    if (!parsed.ok()) return parsed.status();
    c.test_reshape_at = parsed->iteration;
    c.test_reshape_pp = parsed->target.pp;
    c.test_reshape_dp = parsed->target.dp;
    c.test_reshape_boundaries = parsed->target.boundaries;
  }
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
