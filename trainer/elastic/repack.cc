#include "trainer/elastic/repack.h"

#include <utility>

namespace dynmo::trainer {

absl::Status ShrinkToSurvivors(const RepackStep& step, PipelineStage& stage,
                               std::unique_ptr<Transport>* transport) {
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
