// A plan as plain data (wire::Plan) and the one codec between it and the
// wire (dynmo.v1.Plan). The coordinator writes every plan through it, and
// every rank reads one through it: the agent hands the trainer, the Python
// binding and dynmo-loadgen a wire::Plan, never the message. Stages are
// named by original id everywhere in it (see README: stage naming), the
// moves and the split are the core's own structs. Nothing is checked here:
// the trainer checks what it executes (trainer/elastic/plan_step.h).
// Pure; thread-safe.
#ifndef DYNMO_WIRE_PLAN_CODEC_H_
#define DYNMO_WIRE_PLAN_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/boundaries.h"
#include "core/migration.h"
#include "core/repack.h"
#include "dynmo/v1/plan.pb.h"

namespace dynmo::wire {

// plan.proto's Reshape: the job's ranks as pp' x dp'.
struct Reshape {
  int pipeline_size = 1;
  int data_parallel_size = 1;
  int64_t copy_bytes = 0;
  double predicted_microbatches_per_s = 0;
  double release_microbatches_per_s = 0;
  double previous_microbatches_per_s = 0;
};

struct Plan {
  std::string job;
  uint64_t epoch = 0;
  int64_t apply_iteration = 0;
  core::Boundaries boundaries;          // over active_stages
  std::vector<int> active_stages;       // original ids, pipeline order; empty = as running
  std::vector<int> released_stages;     // original ids
  std::vector<core::LayerMigration> migrations;  // original ids, with rounds
  std::vector<core::CommSplit> split;   // one per stage active before the plan
  int64_t migration_bytes = 0;
  double predicted_bottleneck_s = 0;
  double previous_bottleneck_s = 0;
  std::string reason;
  int64_t decided_unix_nanos = 0;
  bool commit_with_prepare = false;
  std::optional<Reshape> reshape;
};

Plan PlanFromProto(const dynmo::v1::Plan& proto);
std::optional<Plan> PlanFromProto(const std::optional<dynmo::v1::Plan>& proto);
// Writes every field of `plan` into `proto` (lists appended).
void PlanToProto(const Plan& plan, dynmo::v1::Plan* proto);

}  // namespace dynmo::wire

#endif  // DYNMO_WIRE_PLAN_CODEC_H_
