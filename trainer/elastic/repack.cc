#include "trainer/elastic/repack.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/migration.h"

namespace dynmo::trainer {

absl::Status ApplyLayoutStep(const RepackStep& step, const core::MigrationPlan& moves,
                             PipelineStage& stage,
                             std::unique_ptr<Transport>* transport) {
  // Moves in current active indices: every destination is a running stage.
  if (absl::Status s = stage.ApplyMigration(moves, step.expanded_to); !s.ok()) {
    return s;
  }
  if (!step.releases()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Transport>> shrunk = (*transport)->Shrink(step.new_rank);
  if (!shrunk.ok()) return shrunk.status();
  if (*shrunk != nullptr) {
    const int me = (*shrunk)->rank();
    const int dp = static_cast<int>(step.new_rank.size() / step.from.active_stages.size());
    stage.Rebind(me / dp, static_cast<int>(step.to.active_stages.size()), shrunk->get());
  }
  *transport = *std::move(shrunk);
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
