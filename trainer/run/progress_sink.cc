#include "trainer/run/progress_sink.h"

#include <cstdio>
#include <iostream>

#include "absl/strings/str_join.h"

namespace dynmo::trainer {

absl::Status ProgressSink::Start() {
  if (env_.rank != 0) return absl::OkStatus();
  if (!config_.log_json.empty()) {
    absl::StatusOr<JsonLogWriter> w = JsonLogWriter::Open(config_.log_json);
    if (!w.ok()) return w.status();
    json_.emplace(std::move(*w));
  }
  absl::StatusOr<core::Boundaries> b = StartingBoundaries(config_);
  std::cout << "dynmo-train: world " << env_.world_size << " = pp " << config_.pp << " x dp "
            << config_.dp << ", " << config_.model.num_pipeline_layers()
            << " pipeline layers, boundaries " << (b.ok() ? absl::StrJoin(*b, ",") : "?")
            << ", data " << config_.data << ", coordinator " << config_.coordinator
            << " (job " << config_.job << ")" << std::endl;
  return absl::OkStatus();
}

absl::Status ProgressSink::Record(const IterationRecord& r) {
  if (!json_ && !config_.log_json.empty()) {
    absl::StatusOr<JsonLogWriter> w = JsonLogWriter::Open(config_.log_json, /*append=*/true);
    if (!w.ok()) return w.status();
    json_.emplace(std::move(*w));
  }
  if (json_) {
    if (absl::Status s = json_->Write(r); !s.ok()) return s;
  }
  if (!trace_ && !config_.trace.empty()) {
    absl::StatusOr<TraceWriter> w =
        TraceWriter::Open(config_.trace, /*append=*/env_.rank != 0);
    if (!w.ok()) return w.status();
    trace_.emplace(std::move(*w));
  }
  if (trace_) {
    if (absl::Status s = trace_->Write(r, r.microbatches); !s.ok()) return s;
  }
  window_.push_back(r);
  tokens_per_s_sum_ += r.tokens_per_s;
  ++records_;
  last_ = r;
  logged_last_ = r.iter + 1 == config_.steps;
  if (static_cast<int>(window_.size()) == config_.log_interval || logged_last_) {
    std::cout << FormatProgressLine(window_) << std::endl;
    window_.clear();
  }
  return absl::OkStatus();
}

void ProgressSink::Finish() const {
  if (!logged_last_) return;
  std::printf("dynmo-train: done, %d iterations, final loss %.4f, mean %.0f tok/s\n",
              config_.steps, last_.loss, tokens_per_s_sum_ / records_);
}

}  // namespace dynmo::trainer
