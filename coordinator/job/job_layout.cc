#include "coordinator/job/job_layout.h"

#include <utility>

#include "core/partition.h"

namespace dynmo::service {

void SetStages(std::vector<int> active, core::Boundaries boundaries,
               int pipeline_size, int num_layers, JobLayout* layout) {
  if (active.empty()) {
    active.resize(static_cast<size_t>(pipeline_size > 0 ? pipeline_size : 0));
    for (size_t i = 0; i < active.size(); ++i) active[i] = static_cast<int>(i);
  }
  layout->active_stages = std::move(active);
  layout->boundaries =
      !boundaries.empty()
          ? std::move(boundaries)
          : core::PartitionUniform(num_layers,
                                   static_cast<int>(layout->active_stages.size()));
}

void SetStagesOf(const dynmo::v1::RegisterRequest& r, JobLayout* layout) {
  SetStages({r.active_stages().begin(), r.active_stages().end()},
            {r.boundaries().begin(), r.boundaries().end()}, r.pipeline_size(),
            r.num_layers(), layout);
}

JobLayout StartingLayout(int microbatches, const std::string& schedule,
                         std::vector<int> active, core::Boundaries boundaries,
                         int pipeline_size, int num_layers) {
  JobLayout layout;
  layout.microbatches = microbatches > 0 ? microbatches : 1;
  layout.schedule = core::ParseSchedule(schedule).value_or(layout.schedule);
  SetStages(std::move(active), std::move(boundaries), pipeline_size, num_layers,
            &layout);
  return layout;
}

}  // namespace dynmo::service
