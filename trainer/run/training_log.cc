#include "trainer/run/training_log.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/measures.h"
#include "nlohmann/json.hpp"

namespace dynmo::trainer {

std::vector<double> StageTimes(absl::Span<const int> b,
                               absl::Span<const double> layer_forward_s,
                               absl::Span<const double> layer_backward_s) {
  std::vector<double> out(b.empty() ? 0 : b.size() - 1, 0.0);
  for (size_t s = 0; s < out.size(); ++s) {
    for (int l = b[s]; l < b[s + 1]; ++l) {
      out[s] += layer_forward_s[l] + layer_backward_s[l];
    }
  }
  return out;
}


std::string FormatProgressLine(absl::Span<const IterationRecord> window) {
  if (window.empty()) return "";
  const double n = static_cast<double>(window.size());
  double loss = 0, tokens_per_s = 0;
  std::vector<double> stages(window.back().stage_times_s.size(), 0.0);
  for (const IterationRecord& r : window) {
    loss += r.loss / n;
    tokens_per_s += r.tokens_per_s / n;
    for (size_t s = 0; s < stages.size() && s < r.stage_times_s.size(); ++s) {
      stages[s] += r.stage_times_s[s] / n;
    }
  }
  std::string stage_ms;
  for (double t : stages) absl::StrAppendFormat(&stage_ms, " %.1f", t * 1e3);
  return absl::StrFormat(
      "iter %d | loss %.4f | %.0f tok/s | stages%s ms | imbalance %.2f | "
      "epoch %d | ranks %d",
      window.back().iter, loss, tokens_per_s, stage_ms, core::Imbalance(stages),
      window.back().epoch, window.back().active_ranks);
}

std::string IterationJson(const IterationRecord& r) {
  nlohmann::json j;
  j["iter"] = r.iter;
  j["loss"] = r.loss;
  j["tokens_per_s"] = r.tokens_per_s;
  j["stage_times"] = r.stage_times_s;
  j["boundaries"] = r.boundaries;
  j["epoch"] = r.epoch;
  j["active_ranks"] = r.active_ranks;
  j["microbatches"] = r.microbatches;
  j["iteration_s"] = r.iteration_s;
  j["layer_forward_s"] = r.layer_forward_s;
  j["layer_backward_s"] = r.layer_backward_s;
  j["layer_weight_grad_s"] = r.layer_weight_grad_s;
  j["layer_activation_bytes"] = r.layer_activation_bytes;
  j["layer_params"] = r.layer_params;
  j["stage_memory_bytes"] = r.stage_memory_bytes;
  j["layer_memory_bytes"] = r.layer_memory_bytes;
  j["memory_capacity_bytes"] = r.memory_capacity_bytes;
  j["model_changed"] = r.model_changed;
  return j.dump();
}

JsonLogWriter::JsonLogWriter(std::string path, bool append)
    : path_(std::move(path)), out_(path_, append ? std::ios::app : std::ios::trunc) {}

absl::StatusOr<JsonLogWriter> JsonLogWriter::Open(const std::string& path,
                                                  bool append) {
  JsonLogWriter writer(path, append);
  if (!writer.out_) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_json: cannot open ", path, " for writing"));
  }
  return writer;
}

absl::Status JsonLogWriter::Write(const IterationRecord& record) {
  out_ << IterationJson(record) << '\n';
  out_.flush();
  if (!out_) return absl::InternalError(absl::StrCat("write to ", path_, " failed"));
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
