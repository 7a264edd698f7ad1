// OpTimeline: one rank's real pipeline schedule over a window of
// iterations, as a chrome trace-event file that Perfetto
// (https://ui.perfetto.dev) and chrome://tracing open — `dynmo-train
// --perfetto_out=DIR` writes DIR/rank<R>_trace.json, the per-rank layout
// torchtitan's profiler uses.
//
// TimedOps wraps the stage's StageOps and records one complete slice per
// operation the 1F1B executor runs, named like PyTorch's pipeline schedule
// actions: "PP:<stage>F<mb>", "PP:<stage>B<mb>", and for communication
// "PP:<stage>RECV_F<mb>", "PP:<stage>SEND_F<mb>", "PP:<stage>SEND_B<mb>",
// "PP:<stage>RECV_B<mb>" (a paired exchange is one slice naming both). The
// times are the host's steady clock; on a GPU the caller passes a `sync`
// that waits for the device before each timestamp, so the slices are the
// device's — within the window only (its cost is the window's). Plans
// applied and model changes are instant events.
//
// The window is bounded (`count` iterations, at most kMaxSlices slices):
// a long run never grows the buffer. Thread-compatible: the rank's one
// training thread records; Write after the window.
#ifndef DYNMO_TRAINER_STAGE_OP_TIMELINE_H_
#define DYNMO_TRAINER_STAGE_OP_TIMELINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainer/stage/one_f_one_b.h"

namespace dynmo::trainer {

class OpTimeline {
 public:
  static constexpr size_t kMaxSlices = 1 << 20;

  // Records iterations [first, first + count); count >= 0.
  OpTimeline(int64_t first, int64_t count);

  bool Covers(int64_t iteration) const {
    return iteration >= first_ && iteration < first_ + count_;
  }
  // Microseconds since the timeline began.
  double NowUs() const;

  void Slice(std::string name, std::string category, int64_t iteration, double start_us,
             double end_us);
  void Instant(std::string name, int64_t iteration, std::string detail);

  // The chrome trace of what was recorded: process "rank R", one track
  // ("stage S") for the schedule's slices, one for the instants.
  std::string ChromeTraceJson(int rank, int stage) const;
  // Writes ChromeTraceJson to `path` (INVALID_ARGUMENT naming it when it
  // cannot be written).
  absl::Status Write(const std::string& path, int rank, int stage) const;

  size_t slices() const { return slices_.size(); }

 private:
  struct Event {
    std::string name;
    std::string category;
    int64_t iteration;
    double start_us;
    double dur_us;  // < 0: an instant
    std::string detail;
  };
  int64_t first_;
  int64_t count_;
  std::chrono::steady_clock::time_point origin_;
  std::vector<Event> slices_;
};

// A StageOps that times every operation of `inner` into `timeline` as
// iteration `iteration` of stage `stage` of `num_stages`; the halves that
// are no-ops at the pipeline's ends (the first stage's receive-forward and
// send-backward, the last stage's send-forward and receive-backward) are
// passed through unrecorded. `sync` (may be empty) runs before each
// timestamp.
class TimedOps : public StageOps {
 public:
  TimedOps(StageOps& inner, OpTimeline& timeline, int stage, int num_stages,
           int64_t iteration, std::function<void()> sync);

  absl::Status RecvForward(int mb) override;
  absl::Status Forward(int mb) override;
  absl::Status SendForward(int mb) override;
  absl::Status SendForwardRecvBackward(int send_mb, int recv_mb) override;
  absl::Status Backward(int mb) override;
  absl::Status SendBackward(int mb) override;
  absl::Status SendBackwardRecvForward(int send_mb, int recv_mb) override;
  absl::Status RecvBackward(int mb) override;

 private:
  template <typename Op>
  absl::Status Timed(const std::string& action, const char* category, Op op);

  StageOps& inner_;
  OpTimeline& timeline_;
  const bool first_;
  const bool last_;
  const std::string prefix_;  // "PP:<stage>"
  const int64_t iteration_;
  std::function<void()> sync_;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STAGE_OP_TIMELINE_H_
