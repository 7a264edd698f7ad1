// ProgressSink: what dynmo-train does with each finished iteration's record
// on whichever process is rank 0 now (after a re-pack that released the
// first stage, a survivor continues): appends it to --log_json and --trace,
// prints a progress line every --log_interval iterations, and at the end
// the run's summary. Owned by main's thread; not thread-safe.
#ifndef DYNMO_TRAINER_RUN_PROGRESS_SINK_H_
#define DYNMO_TRAINER_RUN_PROGRESS_SINK_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "trainer/comm/dist_env.h"
#include "trainer/config/config.h"
#include "trainer/run/trace_log.h"
#include "trainer/run/training_log.h"

namespace dynmo::trainer {

class ProgressSink {
 public:
  ProgressSink(const TrainerConfig& config, const DistEnv& env)
      : config_(config), env_(env) {}

  // Rank 0 at start: opens --log_json (truncating) and prints the job's line.
  absl::Status Start();

  // One iteration's record (the RunTraining callback).
  absl::Status Record(const IterationRecord& r);

  // The closing line, when this process logged the last iteration.
  void Finish() const;

 private:
  const TrainerConfig& config_;
  const DistEnv& env_;
  std::optional<JsonLogWriter> json_;
  std::optional<TraceWriter> trace_;
  std::vector<IterationRecord> window_;
  double tokens_per_s_sum_ = 0;
  int records_ = 0;
  IterationRecord last_;
  bool logged_last_ = false;  // this process was rank 0 at the last iteration
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_RUN_PROGRESS_SINK_H_
