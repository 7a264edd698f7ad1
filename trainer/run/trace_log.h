// --trace: the trainer's measurements as the trace the simulator replays
// (core/trace.h, JSON Lines via formats/trace_json.h),
// so `dynmo-sim --trace FILE` replays a real run.
//
// One record per iteration: per pipeline layer, fwd / bwd = the measured
// forward / backward seconds per micro-batch (mean over dp replicas), wgrad
// = 0 because the trainer's backward computes input and weight gradients in
// one autograd pass (bwd holds both, which is what 1F1B and GPipe replay;
// a ZB-H1 replay of it sees no separable W), and mem_bytes = the layer's
// resident bytes (parameters, buffers, gradients, AdamW state) — what a
// migration moves. No LibTorch.
#ifndef DYNMO_TRAINER_RUN_TRACE_LOG_H_
#define DYNMO_TRAINER_RUN_TRACE_LOG_H_

#include <fstream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/trace.h"
#include "trainer/run/training_log.h"

namespace dynmo::trainer {

// The trace record of one iteration of a job with `microbatches`
// micro-batches per replica.
core::TraceRecord TraceRecordOf(const IterationRecord& record, int microbatches);

// Appends TraceRecordOf lines to a file, flushing each; records whose iter
// does not grow (or whose layer count changes) are rejected, as the reader
// would reject them.
class TraceWriter {
 public:
  // Truncates `path` (appends with `append`). Errors: cannot open.
  static absl::StatusOr<TraceWriter> Open(const std::string& path, bool append = false);
  absl::Status Write(const IterationRecord& record, int microbatches);

 private:
  TraceWriter(std::string path, bool append);
  std::string path_;
  std::ofstream out_;
  std::optional<core::TraceRecord> previous_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_RUN_TRACE_LOG_H_
