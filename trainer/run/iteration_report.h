// IterationReporter: what one finished iteration tells the world. Each rank
// reports its stage's per-layer measurements to the coordinator through its
// agent (per micro-batch, never blocking) and puts them into one world
// all-reduce — [loss of its replica, then per layer: forward, backward,
// resident bytes, weight-gradient time, activation bytes, parameters; then
// memory used per stage; then whether its model changed; then the
// dynamic-model schemes' counters (dynamism.h), handed back summed to the
// stage; then the plan sources' agreement on the change due at the next
// iteration (plan_source.h), handed back summed to them] — from which rank
// 0 builds the job-wide IterationRecord (means over the dp replicas: each
// layer has dp owners, each replica one last stage).
//
// Not thread-safe: the rank's training thread.
#ifndef DYNMO_TRAINER_RUN_ITERATION_REPORT_H_
#define DYNMO_TRAINER_RUN_ITERATION_REPORT_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "agent/agent.h"
#include "core/boundaries.h"
#include "trainer/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/elastic/plan_source.h"
#include "trainer/run/training_log.h"
#include "trainer/stage/pipeline_stage.h"

namespace dynmo::trainer {

class IterationReporter {
 public:
  // `device_sharing`: the ranks computing on `device` (device.h's
  // RanksSharingThisDevice), what its memory is divided among.
  IterationReporter(const TrainerConfig& config, torch::Device device,
                    int64_t memory_capacity_bytes, int device_sharing);

  // After stage.RunIteration(iter): reports to `agent` (may be null) and
  // all-reduces the summary over `transport`, whose stages are the
  // `active_pp` running ones.
  // `probe_s`: this iteration's speed-probe seconds (0: none);
  // `iteration_s`: its wall seconds on this rank (0: not measured);
  // `sources`: their agreement on the change due before iteration iter + 1
  // rides this all-reduce (every rank passes the same sources).
  absl::Status Gather(int64_t iter, PipelineStage& stage,
                      const StageIterationStats& stats, bool model_changed,
                      int active_pp, Transport& transport, agent::Agent* agent,
                      double probe_s = 0, double iteration_s = 0,
                      absl::Span<const std::unique_ptr<PlanSource>> sources = {});

  // Rank 0, after Gather: the job-wide record of the iteration.
  IterationRecord Record(int64_t iter, double seconds, const core::Boundaries& boundaries,
                         int64_t epoch, int active_ranks);

 private:
  const TrainerConfig& config_;
  torch::Device device_;
  int64_t memory_capacity_;
  int device_sharing_;
  int num_layers_;
  int active_pp_ = 0;
  torch::Tensor summary_;
  // Parameters each local layer still has, recounted when the model or the
  // stage's layers changed (a mask count is a device sync on cuda).
  std::vector<int64_t> nonzero_params_;
  std::vector<int> nonzero_ids_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_RUN_ITERATION_REPORT_H_
