#include "trainer/run/trace_log.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "formats/trace_json.h"

namespace dynmo::trainer {

core::TraceRecord TraceRecordOf(const IterationRecord& r, int microbatches) {
  core::TraceRecord out;
  out.iter = r.iter;
  const double m = microbatches > 0 ? microbatches : 1;
  for (size_t l = 0; l < r.layer_forward_s.size(); ++l) {
    core::TraceLayer layer;
    layer.fwd_s = r.layer_forward_s[l] / m;
    layer.bwd_s = l < r.layer_backward_s.size() ? r.layer_backward_s[l] / m : 0;
    layer.wgrad_s = 0;
    layer.mem_bytes = l < r.layer_memory_bytes.size() ? r.layer_memory_bytes[l] : 0;
    out.layers.push_back(layer);
  }
  return out;
}

TraceWriter::TraceWriter(std::string path, bool append)
    : path_(std::move(path)), out_(path_, append ? std::ios::app : std::ios::trunc) {}

absl::StatusOr<TraceWriter> TraceWriter::Open(const std::string& path, bool append) {
  TraceWriter writer(path, append);
  if (!writer.out_) {
    return absl::InvalidArgumentError(absl::StrCat("--trace: cannot open ", path, " for writing"));
  }
  return writer;
}

absl::Status TraceWriter::Write(const IterationRecord& record, int microbatches) {
  core::TraceRecord r = TraceRecordOf(record, microbatches);
  if (absl::Status s = core::ValidateTraceRecord(r, previous_ ? &*previous_ : nullptr);
      !s.ok()) {
    return absl::InternalError(absl::StrCat("--trace: ", s.message()));
  }
  out_ << formats::TraceToJsonl({r});
  out_.flush();
  if (!out_) return absl::InternalError(absl::StrCat("write to ", path_, " failed"));
  previous_ = std::move(r);
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
