#include "trainer/stage/op_timeline.h"

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dynmo::trainer {

OpTimeline::OpTimeline(int64_t first, int64_t count)
    : first_(first), count_(count < 0 ? 0 : count), origin_(std::chrono::steady_clock::now()) {}

double OpTimeline::NowUs() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_)
      .count();
}

void OpTimeline::Slice(std::string name, std::string category, int64_t iteration,
                       double start_us, double end_us) {
  if (slices_.size() >= kMaxSlices) return;
  slices_.push_back(Event{std::move(name), std::move(category), iteration, start_us,
                          end_us > start_us ? end_us - start_us : 0.0, ""});
}

void OpTimeline::Instant(std::string name, int64_t iteration, std::string detail) {
  if (slices_.size() >= kMaxSlices) return;
  slices_.push_back(
      Event{std::move(name), "event", iteration, NowUs(), -1.0, std::move(detail)});
}

std::string OpTimeline::ChromeTraceJson(int rank, int stage) const {
  using nlohmann::json;
  json events = json::array();
  auto meta = [&](int tid, const char* what, json args) {
    events.push_back({{"ph", "M"}, {"pid", rank}, {"tid", tid}, {"name", what}, {"args", args}});
  };
  meta(0, "process_name", {{"name", absl::StrCat("rank ", rank)}});
  meta(0, "thread_name", {{"name", absl::StrCat("stage ", stage)}});
  meta(1, "thread_name", {{"name", "plans and model changes"}});
  for (const Event& e : slices_) {
    json j = {{"name", e.name}, {"cat", e.category}, {"pid", rank},
              {"ts", e.start_us}, {"args", {{"iteration", e.iteration}}}};
    if (e.dur_us < 0) {
      j["ph"] = "i";
      j["s"] = "p";
      j["tid"] = 1;
      if (!e.detail.empty()) j["args"]["detail"] = e.detail;
    } else {
      j["ph"] = "X";
      j["tid"] = 0;
      j["dur"] = e.dur_us;
    }
    events.push_back(std::move(j));
  }
  return json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

absl::Status OpTimeline::Write(const std::string& path, int rank, int stage) const {
  std::ofstream out(path, std::ios::trunc);
  if (out) out << ChromeTraceJson(rank, stage) << "\n";
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat("--perfetto_out: cannot write ", path));
  }
  return absl::OkStatus();
}

TimedOps::TimedOps(StageOps& inner, OpTimeline& timeline, int stage, int num_stages,
                   int64_t iteration, std::function<void()> sync)
    : inner_(inner),
      timeline_(timeline),
      first_(stage == 0),
      last_(stage == num_stages - 1),
      prefix_(absl::StrCat("PP:", stage)),
      iteration_(iteration),
      sync_(std::move(sync)) {}

template <typename Op>
absl::Status TimedOps::Timed(const std::string& action, const char* category, Op op) {
  if (sync_) sync_();
  const double start = timeline_.NowUs();
  absl::Status s = op();
  if (sync_) sync_();
  timeline_.Slice(prefix_ + action, category, iteration_, start, timeline_.NowUs());
  return s;
}

absl::Status TimedOps::RecvForward(int mb) {
  if (first_) return inner_.RecvForward(mb);
  return Timed(absl::StrCat("RECV_F", mb), "comm", [&] { return inner_.RecvForward(mb); });
}
absl::Status TimedOps::Forward(int mb) {
  return Timed(absl::StrCat("F", mb), "compute", [&] { return inner_.Forward(mb); });
}
absl::Status TimedOps::SendForward(int mb) {
  if (last_) return inner_.SendForward(mb);
  return Timed(absl::StrCat("SEND_F", mb), "comm", [&] { return inner_.SendForward(mb); });
}
absl::Status TimedOps::SendForwardRecvBackward(int send_mb, int recv_mb) {
  if (last_) return inner_.SendForwardRecvBackward(send_mb, recv_mb);
  return Timed(absl::StrCat("SEND_F", send_mb, "+RECV_B", recv_mb), "comm",
               [&] { return inner_.SendForwardRecvBackward(send_mb, recv_mb); });
}
absl::Status TimedOps::Backward(int mb) {
  return Timed(absl::StrCat("B", mb), "compute", [&] { return inner_.Backward(mb); });
}
absl::Status TimedOps::SendBackward(int mb) {
  if (first_) return inner_.SendBackward(mb);
  return Timed(absl::StrCat("SEND_B", mb), "comm", [&] { return inner_.SendBackward(mb); });
}
absl::Status TimedOps::SendBackwardRecvForward(int send_mb, int recv_mb) {
  if (first_) return inner_.SendBackwardRecvForward(send_mb, recv_mb);
  return Timed(absl::StrCat("SEND_B", send_mb, "+RECV_F", recv_mb), "comm",
               [&] { return inner_.SendBackwardRecvForward(send_mb, recv_mb); });
}
absl::Status TimedOps::RecvBackward(int mb) {
  if (last_) return inner_.RecvBackward(mb);
  return Timed(absl::StrCat("RECV_B", mb), "comm", [&] { return inner_.RecvBackward(mb); });
}

}  // namespace dynmo::trainer
