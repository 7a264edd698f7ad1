// What one training iteration reports, and the two ways a user sees it: the
// progress line printed per window of iterations and the --log_json record
// (one JSON object per line, per iteration). Rank 0 writes both; the numbers
// are already reduced over the whole job (see trainer.h). No LibTorch.
#ifndef DYNMO_TRAINER_RUN_TRAINING_LOG_H_
#define DYNMO_TRAINER_RUN_TRAINING_LOG_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/boundaries.h"

namespace dynmo::trainer {

struct IterationRecord {
  int64_t iter = 0;
  double loss = 0;          // mean over micro-batches and dp replicas
  double tokens_per_s = 0;  // the job's tokens this iteration / its wall time
  double iteration_s = 0;   // wall time of the iteration on rank 0
  // Per pipeline layer, summed over micro-batches, mean over dp replicas.
  std::vector<double> layer_forward_s;
  std::vector<double> layer_backward_s;
  // The weight-gradient part of layer_backward_s (pipeline_stage.h).
  std::vector<double> layer_weight_grad_s;
  // Per pipeline layer, mean over dp replicas: the most activation bytes
  // one micro-batch's forward left allocated (measured, activation_meter.h)
  // and the parameters it still has (stage_memory.h): what each rank
  // reports to the coordinator.
  std::vector<int64_t> layer_activation_bytes;
  std::vector<int64_t> layer_params;
  // Per stage: the forward + backward compute time of its layers.
  std::vector<double> stage_times_s;
  core::Boundaries boundaries;
  int64_t epoch = 0;  // plan epoch the iteration ran under
  int active_ranks = 0;  // ranks running the job (pp x dp after re-packing)
  int microbatches = 0;  // per dp replica (a re-shape changes it)
  // Memory (stage_memory.h), mean over dp replicas: per pipeline layer its
  // resident bytes (parameters, buffers, gradients, AdamW state), per stage
  // the memory used by one of its ranks (those layers + peak stashed
  // activations), and one rank's capacity.
  std::vector<int64_t> layer_memory_bytes;
  std::vector<int64_t> stage_memory_bytes;
  int64_t memory_capacity_bytes = 0;
  // Some rank's dynamic-model scheme changed per-layer costs during this
  // iteration (pruned, froze, exits moved): the on-event trigger's signal.
  bool model_changed = false;
};

// Sums each stage's layer times under `b` into stage_times_s.
std::vector<double> StageTimes(absl::Span<const int> b,
                               absl::Span<const double> layer_forward_s,
                               absl::Span<const double> layer_backward_s);

// "iter 10 | loss 3.2101 | 5123 tok/s | stages 12.1 11.8 ms | imbalance 0.03
//  | epoch 0 | ranks 4", imbalance being the paper's (max - min) / mean for a window of iterations (averages over the window).
std::string FormatProgressLine(absl::Span<const IterationRecord> window);

// One line of JSON: iter, loss, tokens_per_s, stage_times (seconds),
// boundaries, epoch, active_ranks, microbatches, plus iteration_s and per-layer times.
std::string IterationJson(const IterationRecord& record);

// Appends IterationJson lines to a file, flushing each.
class JsonLogWriter {
 public:
  // Truncates `path` (appends to it with `append`: a rank that becomes
  // rank 0 after a re-pack continues the log). Errors: cannot open for writing.
  static absl::StatusOr<JsonLogWriter> Open(const std::string& path,
                                            bool append = false);
  absl::Status Write(const IterationRecord& record);

 private:
  JsonLogWriter(std::string path, bool append);
  std::string path_;
  std::ofstream out_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_RUN_TRAINING_LOG_H_
