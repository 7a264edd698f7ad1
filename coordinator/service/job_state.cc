#include "coordinator/service/job_state.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/core/cost_noise.h"
#include "coordinator/core/measures.h"
#include "coordinator/core/partition.h"
#include "coordinator/service/plan_convert.h"
#include "coordinator/service/proto_convert.h"
#include "coordinator/service/validation.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;
using dynmo::v1::PlanOutcome;

std::vector<int> AllStages(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

double Smooth(double old_v, double new_v, double w) {
  return w * new_v + (1 - w) * old_v;
}

int64_t Smooth64(int64_t old_v, int64_t new_v, double w) {
  return static_cast<int64_t>(std::llround(w * new_v + (1 - w) * old_v));
}

const char* OutcomeName(PlanOutcome o) {
  switch (o) {
    case dynmo::v1::PLAN_OUTCOME_PREPARING: return "preparing";
    case dynmo::v1::PLAN_OUTCOME_COMMITTED: return "committed";
    case dynmo::v1::PLAN_OUTCOME_APPLIED: return "applied";
    case dynmo::v1::PLAN_OUTCOME_ABORTED: return "aborted";
    default: return "idle";
  }
}

}  // namespace

JobState::JobState(const dynmo::v1::RegisterRequest& first,
                   const JobOptions& options, JobDeps deps)
    : name_(first.job()), deps_(deps) {
  absl::MutexLock lock(&mu_);
  pipeline_size_ = first.pipeline_size();
  data_parallel_size_ = first.data_parallel_size();
  num_layers_ = first.num_layers();
  fingerprint_ = first.model_fingerprint();
  microbatches_ = first.microbatches() > 0 ? first.microbatches() : 1;
  if (!first.schedule().empty()) {
    schedule_ = core::ParseSchedule(first.schedule()).value_or(schedule_);
  }
  policy_ = options.default_policy;
  active_stages_ = first.active_stages_size() > 0
                       ? std::vector<int>(first.active_stages().begin(),
                                          first.active_stages().end())
                       : AllStages(pipeline_size_);
  boundaries_ =
      first.boundaries_size() > 0
          ? core::Boundaries(first.boundaries().begin(), first.boundaries().end())
          : core::PartitionUniform(num_layers_,
                                   static_cast<int>(active_stages_.size()));
  // A rank that already ran plans (the coordinator lost its state dir) sets
  // the floor for the epochs: they must never go backwards.
  epoch_ = applied_epoch_ = first.applied_epoch();
  Init(options);
}

JobState::JobState(const dynmo::v1::JobRecord& record,
                   const JobOptions& options, JobDeps deps)
    : name_(record.name()), deps_(deps) {
  absl::MutexLock lock(&mu_);
  pipeline_size_ = record.pipeline_size();
  data_parallel_size_ = record.data_parallel_size();
  num_layers_ = record.num_layers();
  fingerprint_ = record.model_fingerprint();
  microbatches_ = record.microbatches() > 0 ? record.microbatches() : 1;
  schedule_ = core::ParseSchedule(record.schedule()).value_or(schedule_);
  policy_ = PolicyFromProto(record.policy(), options.default_policy)
                .value_or(options.default_policy);
  epoch_ = record.epoch();
  applied_epoch_ = record.applied_epoch();
  boundaries_.assign(record.boundaries().begin(), record.boundaries().end());
  active_stages_.assign(record.active_stages().begin(),
                        record.active_stages().end());
  if (active_stages_.empty()) active_stages_ = AllStages(pipeline_size_);
  if (boundaries_.empty()) {
    boundaries_ = core::PartitionUniform(
        num_layers_, static_cast<int>(active_stages_.size()));
  }
  history_.assign(record.history().begin(), record.history().end());
  Init(options);
  for (const auto& rr : record.ranks()) {
    if (rr.rank() < 0 || rr.rank() >= static_cast<int>(ranks_.size())) continue;
    Rank& r = ranks_[static_cast<size_t>(rr.rank())];
    r.registered = true;
    r.pipeline_rank = rr.pipeline_rank();
    r.data_parallel_rank = rr.data_parallel_rank();
    r.host = rr.host();
    r.device = rr.device();
    r.memory_capacity_bytes = rr.memory_capacity_bytes();
  }
  if (record.has_in_flight()) {
    if (record.in_flight().outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED) {
      in_flight_ = record.in_flight();
      in_flight_since_ = absl::Now();
    } else {
      dynmo::v1::PlanRecord aborted = record.in_flight();
      aborted.set_outcome(dynmo::v1::PLAN_OUTCOME_ABORTED);
      aborted.set_detail("coordinator restarted before every rank prepared");
      aborted.set_outcome_unix_ms(absl::ToUnixMillis(absl::Now()));
      history_.push_back(aborted);
      if (metrics_ != nullptr) metrics_->PlanAborted();
    }
  }
}

void JobState::QueueSend(const std::shared_ptr<SessionSink>& sink,
                         std::vector<int> ranks, const CoordinatorMessage& m) {
  sends_.push_back(PendingSend{sink, std::move(ranks),
                               std::make_shared<const CoordinatorMessage>(m)});
  has_sends_.store(true, std::memory_order_release);
}

void JobState::QueueClose(const std::shared_ptr<SessionSink>& sink) {
  // A multiplexed session may be replaced for several ranks at once.
  if (std::find(closes_.begin(), closes_.end(), sink) != closes_.end()) return;
  closes_.push_back(sink);
  has_sends_.store(true, std::memory_order_release);
}

void JobState::FlushSends() {
  // Sending happens outside the job's lock (a broadcast to thousands of
  // sessions must not stall reports), under send_mu_ so that batches leave
  // in the order they were queued: a COMMIT never overtakes its PREPARE.
  if (!has_sends_.load(std::memory_order_acquire)) return;  // the hot path
  absl::MutexLock send_lock(&send_mu_);
  std::vector<PendingSend> batch;
  std::vector<std::shared_ptr<SessionSink>> closes;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(sends_);
    closes.swap(closes_);
    has_sends_.store(false, std::memory_order_release);
  }
  for (const auto& sink : closes) {
    sink->Close(absl::AbortedError("superseded by a newer session"));
  }
  for (const PendingSend& p : batch) p.sink->SendTo(p.ranks, p.message);
}

absl::Status JobState::Register(const dynmo::v1::RegisterRequest& request,
                                dynmo::v1::RegisterResponse* response) {
  absl::Status s = RegisterUnflushed(request, response);
  FlushSends();
  return s;
}

absl::Status JobState::Attach(int rank, std::shared_ptr<SessionSink> sink) {
  absl::Status s = AttachUnflushed(rank, std::move(sink));
  FlushSends();
  return s;
}

absl::Status JobState::OnReport(int rank,
                                const dynmo::v1::IterationReport& report) {
  absl::Status s = OnReportUnflushed(rank, report);
  FlushSends();
  return s;
}

absl::Status JobState::OnAck(int rank, const dynmo::v1::PlanAck& ack) {
  absl::Status s = OnAckUnflushed(rank, ack);
  FlushSends();
  return s;
}

void JobState::Tick(absl::Time now) {
  TickUnflushed(now);
  FlushSends();
}

absl::StatusOr<dynmo::v1::RebalanceResponse> JobState::Rebalance(
    absl::Time now) {
  absl::StatusOr<dynmo::v1::RebalanceResponse> r = RebalanceUnflushed(now);
  FlushSends();
  return r;
}

void JobState::Init(const JobOptions& options) {
  options_ = options;
  gate_ = std::make_unique<AutoGate>(options.auto_options);
  ranks_.assign(static_cast<size_t>(pipeline_size_ * data_parallel_size_),
                Rank{});
  costs_.assign(static_cast<size_t>(data_parallel_size_),
                std::vector<core::LayerCost>(static_cast<size_t>(num_layers_)));
  for (auto& replica : costs_) {
    for (int i = 0; i < num_layers_; ++i) replica[static_cast<size_t>(i)].id = i;
  }
  seen_.assign(static_cast<size_t>(data_parallel_size_),
               std::vector<bool>(static_cast<size_t>(num_layers_), false));
  noise_.assign(static_cast<size_t>(data_parallel_size_),
                std::vector<core::NoiseTracker>(static_cast<size_t>(num_layers_)));
  missing_ = data_parallel_size_ * num_layers_;
  if (deps_.metrics != nullptr) metrics_ = deps_.metrics->ForJob(name_);
  while (static_cast<int>(history_.size()) > options_.history_limit) {
    history_.pop_front();
  }
}

bool JobState::IsActiveStage(int stage) const {
  return std::binary_search(active_stages_.begin(), active_stages_.end(),
                            stage);
}

bool JobState::Participates(int rank) const {
  const Rank& r = ranks_[static_cast<size_t>(rank)];
  if (r.registered) return IsActiveStage(r.pipeline_rank);
  return true;  // unknown yet: every active rank must show up
}

std::vector<int> JobState::MissingParticipants(bool need_session) const {
  // Active ranks = data_parallel_size * active stages; each must be
  // registered (and connected when asked).
  std::vector<int> missing;
  int present = 0;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (!r.registered || !IsActiveStage(r.pipeline_rank)) continue;
    if (need_session && r.sink == nullptr) {
      missing.push_back(static_cast<int>(i));
      continue;
    }
    ++present;
  }
  const int want =
      data_parallel_size_ * static_cast<int>(active_stages_.size());
  if (present + static_cast<int>(missing.size()) < want) {
    missing.push_back(-1);  // some ranks never registered
  }
  return missing;
}

bool JobState::ActiveRanksReportedSince(int64_t iter) const {
  for (const Rank& r : ranks_) {
    if (r.registered && IsActiveStage(r.pipeline_rank) && r.last_iteration < iter) {
      return false;
    }
  }
  return true;
}

absl::Status JobState::RegisterUnflushed(
    const dynmo::v1::RegisterRequest& request,
    dynmo::v1::RegisterResponse* response) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRegisterLocked(request); !s.ok()) return s;
  // Rank records become durable with the next plan, which is before any of
  // them can be released; only an adopted epoch must be saved right away.
  const bool adopted = ApplyRegisterLocked(request);
  RegisterResponseLocked(request.rank(), response);
  if (adopted) return PersistLocked();
  return absl::OkStatus();
}

absl::Status JobState::RegisterMany(
    const google::protobuf::RepeatedPtrField<dynmo::v1::RegisterRequest>& requests,
    std::vector<dynmo::v1::RegisterResponse>* responses) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    // Check all first: a refused batch registers no rank.
    for (const auto& r : requests) {
      if (status = CheckRegisterLocked(r); !status.ok()) break;
    }
    if (status.ok()) {
      bool adopted = false;
      for (const auto& r : requests) adopted = ApplyRegisterLocked(r) || adopted;
      // Answered after all applied: one rank's adopted epoch and layout
      // are every rank's answer.
      responses->assign(static_cast<size_t>(requests.size()),
                        dynmo::v1::RegisterResponse{});
      for (int i = 0; i < requests.size(); ++i) {
        RegisterResponseLocked(requests[i].rank(),
                               &(*responses)[static_cast<size_t>(i)]);
      }
      if (adopted) status = PersistLocked();
    }
  }
  FlushSends();
  return status;
}

absl::Status JobState::CheckRegisterLocked(
    const dynmo::v1::RegisterRequest& request) const {
  if (request.pipeline_size() != pipeline_size_ ||
      request.data_parallel_size() != data_parallel_size_ ||
      request.num_layers() != num_layers_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", name_, " is ", pipeline_size_, " stages x ",
        data_parallel_size_, " replicas x ", num_layers_,
        " layers; rank ", request.rank(), " registered ",
        request.pipeline_size(), " x ", request.data_parallel_size(), " x ",
        request.num_layers()));
  }
  if (!fingerprint_.empty() && !request.model_fingerprint().empty() &&
      request.model_fingerprint() != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", name_, " runs model '", fingerprint_, "', rank ",
        request.rank(), " registered '", request.model_fingerprint(), "'"));
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& o = ranks_[i];
    if (static_cast<int>(i) != request.rank() && o.registered &&
        o.pipeline_rank == request.pipeline_rank() &&
        o.data_parallel_rank == request.data_parallel_rank()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", request.pipeline_rank(), " replica ",
          request.data_parallel_rank(), " is already rank ", i));
    }
  }
  const Rank& r = ranks_[static_cast<size_t>(request.rank())];
  if (r.registered && (r.pipeline_rank != request.pipeline_rank() ||
                       r.data_parallel_rank != request.data_parallel_rank())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", request.rank(), " was stage ", r.pipeline_rank, " replica ",
        r.data_parallel_rank, ", not stage ", request.pipeline_rank(),
        " replica ", request.data_parallel_rank()));
  }
  return absl::OkStatus();
}

bool JobState::ApplyRegisterLocked(const dynmo::v1::RegisterRequest& request) {
  Rank& r = ranks_[static_cast<size_t>(request.rank())];
  bool adopted = false;
  if (request.applied_epoch() > epoch_) {
    adopted = true;
    // The state dir was lost or is older than the ranks: adopt the rank's
    // epoch and layout so that the next plan is newer than anything applied.
    epoch_ = request.applied_epoch();
    applied_epoch_ = request.applied_epoch();
    if (request.boundaries_size() > 0) {
      boundaries_.assign(request.boundaries().begin(),
                         request.boundaries().end());
      active_stages_ = request.active_stages_size() > 0
                           ? std::vector<int>(request.active_stages().begin(),
                                              request.active_stages().end())
                           : AllStages(pipeline_size_);
    }
  }
  r.registered = true;
  r.pipeline_rank = request.pipeline_rank();
  r.data_parallel_rank = request.data_parallel_rank();
  r.host = request.host();
  r.device = request.device();
  r.memory_capacity_bytes = request.memory_capacity_bytes();
  r.applied_epoch = request.applied_epoch();
  if (fingerprint_.empty()) fingerprint_ = request.model_fingerprint();

  // A committed plan survives a coordinator restart; a re-registering rank
  // that already switched to it settles the outcome.
  if (in_flight_ &&
      in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED &&
      IsActiveStage(r.pipeline_rank)) {
    const uint64_t e = in_flight_->plan().epoch();
    if (request.applied_epoch() >= e) {
      ApplyLocked(absl::StrCat("rank ", request.rank(),
                               " re-registered with the plan applied"));
    } else if (request.pending_epoch() != e) {
      // The rank neither applied nor holds the plan (it restarted): it can
      // never switch, so by the in-band agreement no rank will.
      AbortLocked(absl::StrCat("rank ", request.rank(),
                               " re-registered without the plan"));
    }
  }

  return adopted;
}

void JobState::RegisterResponseLocked(
    int rank, dynmo::v1::RegisterResponse* response) const {
  response->set_epoch(epoch_);
  response->set_applied_epoch(applied_epoch_);
  for (int b : boundaries_) response->add_boundaries(b);
  for (int s : active_stages_) response->add_active_stages(s);
  response->set_released(
      !IsActiveStage(ranks_[static_cast<size_t>(rank)].pipeline_rank));
}

absl::Status JobState::AttachUnflushed(int rank, std::shared_ptr<SessionSink> sink) {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    return absl::NotFoundError(
        absl::StrCat("job ", name_, " has no rank ", rank));
  }
  Rank& r = ranks_[static_cast<size_t>(rank)];
  if (!r.registered) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " of job ", name_,
                     " must call Register before opening a session"));
  }
  if (r.sink != nullptr && r.sink != sink) {
    // Closed after the lock is released: gRPC may run OnDone inline, and
    // OnDone detaches from this job.
    QueueClose(r.sink);
  }
  r.sink = std::move(sink);
  const int one[] = {rank};
  ResendInFlight(r.sink, one);
  return absl::OkStatus();
}

absl::Status JobState::AttachHost(absl::Span<const int> ranks,
                                  std::shared_ptr<SessionSink> sink) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    // Check every rank before binding any.
    for (int rank : ranks) {
      if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
        status = absl::NotFoundError(
            absl::StrCat("job ", name_, " has no rank ", rank, " (it has ",
                         ranks_.size(), ")"));
        break;
      }
      const Rank& r = ranks_[static_cast<size_t>(rank)];
      if (!r.registered) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank, " of job ", name_,
            " must be registered (RegisterHost) before its host session"));
        break;
      }
      if (r.sink != nullptr && r.sink != sink && !r.sink->host().empty() &&
          r.sink->host() != sink->host()) {
        status = absl::AlreadyExistsError(absl::StrCat(
            "rank ", rank, " of job ", name_,
            " is carried by a live host session of host '", r.sink->host(),
            "', not '", sink->host(), "'"));
        break;
      }
    }
    if (status.ok()) {
      for (int rank : ranks) {
        Rank& r = ranks_[static_cast<size_t>(rank)];
        if (r.sink != nullptr && r.sink != sink) QueueClose(r.sink);
        r.sink = sink;
      }
      ResendInFlight(sink, ranks);
    }
  }
  FlushSends();
  return status;
}

void JobState::DetachHost(absl::Span<const int> ranks,
                          const SessionSink* sink) {
  absl::MutexLock lock(&mu_);
  for (int rank : ranks) {
    if (rank < 0 || rank >= static_cast<int>(ranks_.size())) continue;
    Rank& r = ranks_[static_cast<size_t>(rank)];
    if (r.sink.get() == sink) r.sink = nullptr;
  }
}

void JobState::Detach(int rank, const SessionSink* sink) {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) return;
  Rank& r = ranks_[static_cast<size_t>(rank)];
  if (r.sink.get() == sink) r.sink = nullptr;
}

void JobState::ResendInFlight(const std::shared_ptr<SessionSink>& sink,
                              absl::Span<const int> ranks) {
  if (sink == nullptr || ranks.empty()) return;
  if (!in_flight_) {
    // The newest epoch was aborted (maybe while the rank was away): say so,
    // so a rank holding it prepared drops it now instead of at its apply
    // iteration. Harmless when the rank never saw it.
    if (!history_.empty() && history_.back().plan().epoch() == epoch_ &&
        history_.back().outcome() == dynmo::v1::PLAN_OUTCOME_ABORTED) {
      CoordinatorMessage m;
      m.mutable_abort()->set_epoch(epoch_);
      m.mutable_abort()->set_reason(history_.back().detail());
      QueueSend(sink, std::vector<int>(ranks.begin(), ranks.end()), m);
    }
    return;
  }
  std::vector<int> active;
  for (int rank : ranks) {
    if (IsActiveStage(ranks_[static_cast<size_t>(rank)].pipeline_rank)) {
      active.push_back(rank);
    }
  }
  if (active.empty()) return;
  CoordinatorMessage m;
  *m.mutable_prepare() = in_flight_->plan();
  QueueSend(sink, active, m);
  if (in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED &&
      !in_flight_->plan().commit_with_prepare()) {
    CoordinatorMessage c;
    c.mutable_commit()->set_epoch(in_flight_->plan().epoch());
    c.mutable_commit()->set_apply_iteration(
        in_flight_->plan().apply_iteration());
    QueueSend(sink, std::move(active), c);
  }
}

absl::Status JobState::OnReportUnflushed(
    int rank, const dynmo::v1::IterationReport& report) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckReportLocked(rank, report); !s.ok()) return s;
  ApplyReportLocked(rank, report);
  return absl::OkStatus();
}

absl::Status JobState::CheckReportLocked(
    int /*rank*/, const dynmo::v1::IterationReport& report) const {
  if (absl::Status s = ValidateReport(report, num_layers_); !s.ok()) return s;
  if (report.applied_epoch() > epoch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("report ran under epoch ", report.applied_epoch(),
                     " but job ", name_, " never issued an epoch beyond ",
                     epoch_));
  }
  return absl::OkStatus();
}

void JobState::ApplyReportLocked(int rank,
                                 const dynmo::v1::IterationReport& report) {
  Rank& r = ranks_[static_cast<size_t>(rank)];
  const size_t replica = static_cast<size_t>(r.data_parallel_rank);
  // A released stage holds no layers any more; its stragglers are ignored.
  const bool active = IsActiveStage(r.pipeline_rank);
  const double w = report.model_changed() ? 1.0 : options_.smoothing;
  for (const auto& l : report.layers()) {
    if (!active) break;
    const size_t i = static_cast<size_t>(l.layer());
    core::LayerCost& c = costs_[replica][i];
    core::NoiseTracker& noise = noise_[replica][i];
    const double total_s = l.fwd_s() + l.bwd_s() + l.wgrad_s();
    if (report.model_changed()) {
      noise.Reset(total_s);  // the old spread says nothing about the new layer
    } else {
      noise.Add(total_s, options_.noise_smoothing);
    }
    if (!seen_[replica][i]) {
      seen_[replica][i] = true;
      --missing_;
      c.fwd_s = l.fwd_s();
      c.bwd_s = l.bwd_s();
      c.wgrad_s = l.wgrad_s();
      c.params = l.params();
      c.resident_bytes = l.resident_bytes();
      c.activation_bytes = l.activation_bytes();
      continue;
    }
    c.fwd_s = Smooth(c.fwd_s, l.fwd_s(), w);
    c.bwd_s = Smooth(c.bwd_s, l.bwd_s(), w);
    c.wgrad_s = Smooth(c.wgrad_s, l.wgrad_s(), w);
    c.params = l.params();
    c.resident_bytes = Smooth64(c.resident_bytes, l.resident_bytes(), w);
    c.activation_bytes = Smooth64(c.activation_bytes, l.activation_bytes(), w);
  }
  if (report.stage_memory_capacity_bytes() > 0) {
    r.memory_capacity_bytes = report.stage_memory_capacity_bytes();
  }
  if (active) r.memory_used_bytes = report.stage_memory_used_bytes();
  r.last_iteration = report.iteration();
  r.applied_epoch = report.applied_epoch();
  newest_iteration_ = std::max(newest_iteration_, report.iteration());
  model_changed_ = model_changed_ || report.model_changed();
  if (report.model_changed()) {
    model_changed_iteration_ = std::max(model_changed_iteration_, report.iteration());
  }
  dirty_ = true;
  ++reports_;
  if (metrics_ != nullptr) metrics_->Report();

  // A committed plan is settled by the first report of its apply iteration:
  // the ranks agreed in-band, so one rank's epoch speaks for all.
  if (in_flight_ &&
      in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED &&
      report.iteration() >= in_flight_->plan().apply_iteration() &&
      Participates(rank)) {
    if (report.applied_epoch() >= in_flight_->plan().epoch()) {
      ApplyLocked(absl::StrCat("rank ", rank, " ran iteration ",
                               report.iteration(), " under the plan"));
    } else {
      AbortLocked(absl::StrCat("rank ", rank, " ran iteration ",
                               report.iteration(), " under epoch ",
                               report.applied_epoch()));
    }
  }
}

absl::Status JobState::OnAckUnflushed(int rank, const dynmo::v1::PlanAck& ack) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckAckLocked(rank, ack); !s.ok()) return s;
  ApplyAckLocked(rank, ack);
  return absl::OkStatus();
}

absl::Status JobState::CheckAckLocked(int rank,
                                      const dynmo::v1::PlanAck& ack) const {
  if (absl::Status s = ValidateAck(ack); !s.ok()) return s;
  if (ack.epoch() > epoch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ack for epoch ", ack.epoch(), " but job ", name_,
        " never issued an epoch beyond ", epoch_));
  }
  if (in_flight_ && ack.epoch() == in_flight_->plan().epoch() &&
      ack.state() == PlanAck::APPLIED &&
      in_flight_->outcome() != dynmo::v1::PLAN_OUTCOME_COMMITTED) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " applied epoch ", ack.epoch(),
                     " which was never committed"));
  }
  return absl::OkStatus();
}

absl::Status JobState::OnHostBatch(const dynmo::v1::HostBatch& batch) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& m : batch.messages()) {
      if (m.rank() < 0 || m.rank() >= static_cast<int>(ranks_.size())) {
        status = absl::NotFoundError(
            absl::StrCat("job ", name_, " has no rank ", m.rank()));
      } else if (m.has_report()) {
        status = CheckReportLocked(m.rank(), m.report());
      } else if (m.has_ack()) {
        status = CheckAckLocked(m.rank(), m.ack());
      } else {
        status = absl::InvalidArgumentError(absl::StrCat(
            "empty RankMessage for rank ", m.rank(), " in a HostBatch"));
      }
      if (!status.ok()) break;
    }
    if (status.ok()) {
      for (const auto& m : batch.messages()) {
        if (m.has_report()) {
          ApplyReportLocked(m.rank(), m.report());
        } else {
          ApplyAckLocked(m.rank(), m.ack());
        }
      }
    }
  }
  FlushSends();
  return status;
}

void JobState::ApplyAckLocked(int rank, const dynmo::v1::PlanAck& ack) {
  Rank& r = ranks_[static_cast<size_t>(rank)];
  if (ack.iteration() > r.last_iteration) r.last_iteration = ack.iteration();
  // Acks of settled epochs are duplicates or late: idempotent no-ops.
  if (!in_flight_ || ack.epoch() != in_flight_->plan().epoch()) return;
  const bool committed =
      in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_COMMITTED;
  switch (ack.state()) {
    case PlanAck::PREPARED:
      if (committed) {
        // The rank may have missed the COMMIT: send it again (only the
        // COMMIT: re-sending the PREPARE would draw another PREPARED and
        // loop). A plan committed with its PREPARE needs nothing.
        if (r.sink != nullptr && !in_flight_->plan().commit_with_prepare()) {
          CoordinatorMessage c;
          c.mutable_commit()->set_epoch(in_flight_->plan().epoch());
          c.mutable_commit()->set_apply_iteration(
              in_flight_->plan().apply_iteration());
          QueueSend(r.sink, {rank}, c);
        }
        return;
      }
      if (!r.prepared && Participates(rank)) {
        r.prepared = true;
        ++prepared_count_;
      }
      if (prepared_count_ >= participants_) CommitLocked();
      return;
    case PlanAck::FAILED:
      AbortLocked(absl::StrCat("rank ", rank, " failed: ", ack.detail()));
      return;
    case PlanAck::APPLIED:
      if (!committed) return;  // CheckAckLocked refused it
      r.applied_epoch = ack.epoch();
      ApplyLocked(absl::StrCat("rank ", rank, " applied"));
      return;
    default:
      return;  // ValidateAck refused it
  }
}

absl::StatusOr<core::PipelineModel> JobState::ModelLocked() const {
  if (missing_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no complete profile of job ", name_, " yet: ", missing_, " of ",
        data_parallel_size_ * num_layers_, " (replica, layer) samples missing"));
  }
  absl::StatusOr<std::vector<core::LayerCost>> layers =
      core::CombineReplicaProfiles(costs_);
  if (!layers.ok()) return layers.status();
  core::PipelineModel model;
  model.layers = *std::move(layers);
  // Activations of this many micro-batches count into every stage's memory:
  // the first stage's 1F1B peak (min(m, S)), all of them for GPipe; the same
  // for every stage, so re-packing sees identical stages (an upper bound for
  // the later 1F1B stages, which hold fewer).
  const int stages = static_cast<int>(active_stages_.size());
  const int inflight = schedule_ == core::Schedule::kGPipe
                           ? microbatches_
                           : std::min(microbatches_, stages);
  for (int stage : active_stages_) {
    core::StageSpec spec;
    int64_t cap = -1;
    for (const Rank& r : ranks_) {
      if (r.registered && r.pipeline_rank == stage &&
          r.memory_capacity_bytes > 0) {
        cap = cap < 0 ? r.memory_capacity_bytes
                      : std::min(cap, r.memory_capacity_bytes);
      }
    }
    spec.capacity_bytes = cap;
    spec.inflight_microbatches = inflight;
    model.stages.push_back(spec);
  }
  // What a stage measured beyond what its layers explain (allocator slack,
  // workspaces, communication buffers) is not the layers' to carry along,
  // but it is the stage's: it comes off the stage's cap.
  const std::vector<int64_t> used = StageMemoryUsedLocked();
  if (core::ValidateBoundaries(boundaries_, num_layers_, stages).ok()) {
    const std::vector<int64_t> predicted = core::StageMemoryUse(model, boundaries_);
    for (size_t s = 0; s < model.stages.size(); ++s) {
      int64_t& cap = model.stages[s].capacity_bytes;
      const int64_t unexplained = used[s] - predicted[s];
      if (cap >= 0 && unexplained > 0) cap = std::max<int64_t>(0, cap - unexplained);
    }
  }
  return model;
}

std::vector<int64_t> JobState::StageMemoryUsedLocked() const {
  std::vector<int64_t> used(active_stages_.size(), 0);
  for (size_t s = 0; s < active_stages_.size(); ++s) {
    for (const Rank& r : ranks_) {
      if (r.registered && r.pipeline_rank == active_stages_[s]) {
        used[s] = std::max(used[s], r.memory_used_bytes);
      }
    }
  }
  return used;
}

std::vector<double> JobState::LayerNoiseLocked() const {
  std::vector<double> sd(static_cast<size_t>(num_layers_), 0.0);
  for (const auto& replica : noise_) {
    for (size_t i = 0; i < replica.size(); ++i) {
      sd[i] = std::max(sd[i], core::SmoothedSd(replica[i].sd(), options_.smoothing));
    }
  }
  return sd;
}

void JobState::UpdateMeasuresLocked(const core::PipelineModel& model) {
  if (core::ValidateBoundaries(boundaries_, num_layers_,
                               static_cast<int>(model.stages.size()))
          .ok()) {
    core::PartitionSummary sum = core::Summarize(model, boundaries_);
    loads_ = sum.loads;
    imbalance_ = sum.imbalance;
    bottleneck_ = sum.bottleneck;
    lower_bound_ = sum.lower_bound;
    absl::StatusOr<double> bubble =
        core::PredictedBubbleRatio(model, boundaries_, schedule_, microbatches_);
    bubble_ = bubble.ok() ? *bubble : 0;
  }
  if (metrics_ != nullptr) {
    metrics_->SetStageLoads(active_stages_, loads_);
    metrics_->SetMeasures(imbalance_, bottleneck_, lower_bound_, bubble_);
    metrics_->SetGpus(
        data_parallel_size_ * static_cast<int>(active_stages_.size()),
        data_parallel_size_ *
            (pipeline_size_ - static_cast<int>(active_stages_.size())));
  }
}

absl::StatusOr<Decision> JobState::DecideLocked(
    const core::PipelineModel& model) {
  const auto start = std::chrono::steady_clock::now();
  DecisionInput in;
  in.model = model;
  in.active_stages = active_stages_;
  in.current = boundaries_;
  in.policy = policy_;
  in.full_stages = pipeline_size_;
  absl::StatusOr<Decision> d = Decide(in);
  if (deps_.metrics != nullptr) {
    deps_.metrics->DecisionLatency(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return d;
}

absl::StatusOr<dynmo::v1::Plan> JobState::IssueLocked(
    const Decision& d, const std::string& reason, absl::Time now) {
  dynmo::v1::Plan plan;
  plan.set_job(name_);
  plan.set_epoch(epoch_ + 1);
  plan.set_apply_iteration(std::max<int64_t>(newest_iteration_, 0) +
                           options_.plan_lead_iterations);
  SetPlanLayout(d, &plan);
  plan.set_reason(reason);
  plan.set_decided_unix_nanos(absl::ToUnixNanos(now));
  plan.set_commit_with_prepare(options_.in_band_commit);

  // The epoch is durable before any rank can see it.
  const uint64_t old_epoch = epoch_;
  epoch_ = plan.epoch();
  in_flight_.emplace();
  *in_flight_->mutable_plan() = plan;
  if (plan.commit_with_prepare()) {
    // One phase: the ranks' in-band agreement at the apply iteration is the
    // commit, so the plan is committed as it leaves.
    in_flight_->set_outcome(dynmo::v1::PLAN_OUTCOME_COMMITTED);
    in_flight_->set_committed_unix_nanos(absl::ToUnixNanos(now));
  } else {
    in_flight_->set_outcome(dynmo::v1::PLAN_OUTCOME_PREPARING);
  }
  in_flight_since_ = now;
  if (absl::Status s = PersistLocked(); !s.ok()) {
    in_flight_.reset();
    epoch_ = old_epoch;
    return s;
  }
  for (Rank& r : ranks_) r.prepared = false;
  prepared_count_ = 0;
  participants_ = 0;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (Participates(static_cast<int>(i))) ++participants_;
  }
  if (metrics_ != nullptr) metrics_->PlanIssued();
  gate_->OnPlanIssued(newest_iteration_);
  CoordinatorMessage m;
  *m.mutable_prepare() = plan;
  SendToParticipants(m);
  return plan;
}

void JobState::SendToParticipants(const CoordinatorMessage& m) {
  auto shared = std::make_shared<const CoordinatorMessage>(m);
  // One send per sink: a multiplexed session gets the message once with
  // the list of its participating ranks.
  absl::flat_hash_map<const SessionSink*, size_t> index;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (r.sink == nullptr || !Participates(static_cast<int>(i))) continue;
    auto [it, fresh] = index.try_emplace(r.sink.get(), sends_.size());
    if (fresh) sends_.push_back(PendingSend{r.sink, {}, shared});
    sends_[it->second].ranks.push_back(static_cast<int>(i));
  }
  if (!index.empty()) has_sends_.store(true, std::memory_order_release);
}

void JobState::CommitLocked() {
  in_flight_->set_outcome(dynmo::v1::PLAN_OUTCOME_COMMITTED);
  in_flight_->set_committed_unix_nanos(absl::ToUnixNanos(absl::Now()));
  if (absl::Status s = PersistLocked(); !s.ok()) {
    // Not durable: a restart would not know it committed. Abort instead.
    in_flight_->set_outcome(dynmo::v1::PLAN_OUTCOME_PREPARING);
    AbortLocked(absl::StrCat("cannot persist the commit: ", s.message()));
    return;
  }
  CoordinatorMessage m;
  m.mutable_commit()->set_epoch(in_flight_->plan().epoch());
  m.mutable_commit()->set_apply_iteration(in_flight_->plan().apply_iteration());
  SendToParticipants(m);
}

void JobState::AbortLocked(const std::string& why) {
  CoordinatorMessage m;
  m.mutable_abort()->set_epoch(in_flight_->plan().epoch());
  m.mutable_abort()->set_reason(why);
  FinishLocked(dynmo::v1::PLAN_OUTCOME_ABORTED, why);
  SendToParticipants(m);
  if (metrics_ != nullptr) metrics_->PlanAborted();
}

void JobState::ApplyLocked(const std::string& why) {
  const dynmo::v1::Plan plan = in_flight_->plan();
  std::vector<dynmo::v1::ReleasedGpu> released;
  const absl::Time now = absl::Now();
  for (int stage : plan.released_stages()) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const Rank& r = ranks_[i];
      if (!r.registered || r.pipeline_rank != stage) continue;
      dynmo::v1::ReleasedGpu g;
      g.set_job(name_);
      g.set_host(r.host);
      g.set_device(r.device);
      g.set_rank(static_cast<int>(i));
      g.set_stage(stage);
      g.set_memory_capacity_bytes(r.memory_capacity_bytes);
      g.set_epoch(plan.epoch());
      g.set_released_unix_ms(absl::ToUnixMillis(now));
      g.set_reason(absl::StrCat("re-packed by plan epoch ", plan.epoch(), " (",
                                plan.reason(), ")"));
      released.push_back(std::move(g));
    }
  }
  boundaries_.assign(plan.boundaries().begin(), plan.boundaries().end());
  active_stages_.assign(plan.active_stages().begin(),
                        plan.active_stages().end());
  applied_epoch_ = plan.epoch();
  FinishLocked(dynmo::v1::PLAN_OUTCOME_APPLIED, why);
  if (metrics_ != nullptr) {
    metrics_->PlanApplied();
    metrics_->Migrated(static_cast<double>(plan.migration_bytes()));
  }
  if (!released.empty()) {
    // FinishLocked put the job record; the pool commits both at once.
    if (absl::Status s = deps_.pool->Add(std::move(released)); !s.ok()) {
      last_decision_note_ =
          absl::StrCat("released GPUs not persisted: ", s.message());
    }
  }
}

void JobState::FinishLocked(PlanOutcome outcome, const std::string& detail) {
  dynmo::v1::PlanRecord rec = *in_flight_;
  rec.set_outcome(outcome);
  rec.set_detail(detail);
  rec.set_outcome_unix_ms(absl::ToUnixMillis(absl::Now()));
  in_flight_.reset();
  history_.push_back(std::move(rec));
  while (static_cast<int>(history_.size()) > options_.history_limit) {
    history_.pop_front();
  }
  for (Rank& r : ranks_) r.prepared = false;
  prepared_count_ = 0;
  if (absl::Status s = PersistLocked(); !s.ok()) {
    last_decision_note_ = absl::StrCat("state not persisted: ", s.message());
  }
}

void JobState::TickUnflushed(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (in_flight_) {
    if (in_flight_->outcome() == dynmo::v1::PLAN_OUTCOME_PREPARING) {
      const int64_t apply = in_flight_->plan().apply_iteration();
      if (now - in_flight_since_ > options_.prepare_timeout) {
        AbortLocked("not every rank prepared within the prepare timeout");
      } else if (newest_iteration_ >= apply - 1) {
        AbortLocked(absl::StrCat("not every rank prepared before iteration ",
                                 apply - 1));
      }
    }
    return;
  }
  if (!dirty_) return;
  dirty_ = false;
  absl::StatusOr<core::PipelineModel> model = ModelLocked();
  if (!model.ok()) {
    last_decision_note_ = std::string(model.status().message());
    return;
  }
  UpdateMeasuresLocked(*model);

  TriggerState state;
  state.iterations_since_decision = newest_iteration_ - last_decision_iteration_;
  state.model_changed = model_changed_;
  state.changed_costs_complete =
      model_changed_ && ActiveRanksReportedSince(model_changed_iteration_);
  const TriggerCall call = EvaluateTrigger(policy_.trigger, state);
  if (!call.note.empty()) last_decision_note_ = call.note;
  if (!call.decide) return;
  std::string reason = call.reason;
  if (!MissingParticipants(true).empty()) {
    last_decision_note_ = "waiting for every active rank to connect";
    return;  // keep the trigger armed
  }
  last_decision_iteration_ = newest_iteration_;
  model_changed_ = false;
  absl::StatusOr<Decision> d = DecideLocked(*model);
  if (!d.ok()) {
    last_decision_note_ = absl::StrCat("decision failed: ", d.status().message());
    return;
  }
  if (!d->changes_layout) {
    gate_->Observe(AutoVerdict{}, newest_iteration_);
    last_decision_note_ = "layout already optimal";
    return;
  }
  if (policy_.trigger.kind == Trigger::Kind::kAuto) {
    AutoInput ai;
    ai.current_bottleneck_s = d->current_bottleneck_s;
    ai.candidate_bottleneck_s = d->predicted_bottleneck_s;
    ai.migration_bytes = d->migration_bytes;
    ai.microbatches = microbatches_;
    ai.releases_gpus = !d->released_stages.empty();
    if (!ai.releases_gpus) {
      absl::StatusOr<double> noise =
          core::GainNoise(*model, LayerNoiseLocked(), boundaries_, d->boundaries);
      if (noise.ok()) ai.gain_noise_s = *noise;
    }
    const AutoVerdict v = EvaluateAuto(options_.auto_options, ai);
    last_decision_note_ = v.why;
    if (!gate_->Observe(v, newest_iteration_)) return;
  }
  if (!d->released_stages.empty()) reason += "+repack";
  absl::StatusOr<dynmo::v1::Plan> issued = IssueLocked(*d, reason, now);
  if (!issued.ok()) {
    last_decision_note_ =
        absl::StrCat("plan not issued: ", issued.status().message());
  }
}

absl::StatusOr<dynmo::v1::RebalanceResponse> JobState::RebalanceUnflushed(
    absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (in_flight_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan epoch ", in_flight_->plan().epoch(), " of job ", name_,
        " is still ", OutcomeName(in_flight_->outcome())));
  }
  absl::StatusOr<core::PipelineModel> model = ModelLocked();
  if (!model.ok()) return model.status();
  std::vector<int> missing = MissingParticipants(true);
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", name_, " has active ranks without a session (",
        absl::StrJoin(missing, ","), "; -1 = never registered)"));
  }
  UpdateMeasuresLocked(*model);
  absl::StatusOr<Decision> d = DecideLocked(*model);
  if (!d.ok()) return d.status();
  dynmo::v1::RebalanceResponse response;
  if (!d->changes_layout) {
    response.set_issued(false);
    response.set_detail(absl::StrCat(
        "layout already optimal for balancer ",
        core::PartitionMethodName(policy_.balancer),
        policy_.repack ? " with re-packing" : ""));
    return response;
  }
  std::string reason = "operator";
  if (!d->released_stages.empty()) reason += "+repack";
  absl::StatusOr<dynmo::v1::Plan> plan = IssueLocked(*d, reason, now);
  if (!plan.ok()) return plan.status();
  response.set_issued(true);
  *response.mutable_plan() = *plan;
  response.set_detail(absl::StrCat("plan epoch ", plan->epoch(),
                                   " issued, applies at iteration ",
                                   plan->apply_iteration()));
  return response;
}

absl::StatusOr<dynmo::v1::Policy> JobState::SetPolicy(
    const dynmo::v1::Policy& proto) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Policy> p = PolicyFromProto(proto, policy_);
  if (!p.ok()) return p.status();
  const Policy old = policy_;
  policy_ = *p;
  if (absl::Status s = PersistLocked(); !s.ok()) {
    policy_ = old;
    return s;
  }
  dirty_ = true;  // re-evaluate under the new policy
  return PolicyToProto(policy_);
}

dynmo::v1::JobSummary JobState::SummaryLocked() const {
  dynmo::v1::JobSummary s;
  s.set_name(name_);
  s.set_pipeline_size(pipeline_size_);
  s.set_data_parallel_size(data_parallel_size_);
  s.set_num_layers(num_layers_);
  int connected = 0;
  for (const Rank& r : ranks_) connected += r.sink != nullptr ? 1 : 0;
  s.set_connected_ranks(connected);
  s.set_epoch(epoch_);
  s.set_applied_epoch(applied_epoch_);
  s.set_last_iteration(newest_iteration_);
  s.set_imbalance(imbalance_);
  s.set_bottleneck_s(bottleneck_);
  s.set_active_stages(static_cast<int>(active_stages_.size()));
  s.set_released_stages(pipeline_size_ -
                        static_cast<int>(active_stages_.size()));
  *s.mutable_policy() = PolicyToProto(policy_);
  s.set_plan_state(in_flight_ ? OutcomeName(in_flight_->outcome()) : "idle");
  s.set_reports(reports_);
  return s;
}

dynmo::v1::JobSummary JobState::Summary() const {
  absl::MutexLock lock(&mu_);
  return SummaryLocked();
}

dynmo::v1::JobStatus JobState::Status() const {
  absl::MutexLock lock(&mu_);
  dynmo::v1::JobStatus st;
  *st.mutable_summary() = SummaryLocked();
  for (int b : boundaries_) st.add_boundaries(b);
  for (int s : active_stages_) st.add_active_stages(s);
  for (double l : loads_) st.add_stage_load_s(l);
  st.set_lower_bound_s(lower_bound_);
  st.set_predicted_bubble_ratio(bubble_);
  for (const auto& h : history_) *st.add_history() = h;
  if (in_flight_) *st.add_history() = *in_flight_;
  absl::StatusOr<core::PipelineModel> model = ModelLocked();
  if (model.ok()) {
    for (const core::LayerCost& c : model->layers) {
      dynmo::v1::LayerSample* l = st.add_layers();
      l->set_layer(c.id);
      l->set_fwd_s(c.fwd_s);
      l->set_bwd_s(c.bwd_s);
      l->set_wgrad_s(c.wgrad_s);
      l->set_params(c.params);
      l->set_resident_bytes(c.resident_bytes);
      l->set_activation_bytes(c.activation_bytes);
    }
    for (const core::StageSpec& s : model->stages) {
      st.add_stage_memory_cap_bytes(s.capacity_bytes);
    }
  }
  for (int64_t used : StageMemoryUsedLocked()) st.add_stage_memory_used_bytes(used);
  return st;
}

dynmo::v1::JobRecord JobState::RecordLocked() const {
  dynmo::v1::JobRecord rec;
  rec.set_name(name_);
  rec.set_pipeline_size(pipeline_size_);
  rec.set_data_parallel_size(data_parallel_size_);
  rec.set_num_layers(num_layers_);
  rec.set_model_fingerprint(fingerprint_);
  rec.set_microbatches(microbatches_);
  rec.set_schedule(core::ScheduleName(schedule_));
  *rec.mutable_policy() = PolicyToProto(policy_);
  rec.set_epoch(epoch_);
  rec.set_applied_epoch(applied_epoch_);
  for (int b : boundaries_) rec.add_boundaries(b);
  for (int s : active_stages_) rec.add_active_stages(s);
  for (const auto& h : history_) *rec.add_history() = h;
  if (in_flight_) *rec.mutable_in_flight() = *in_flight_;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    if (!r.registered) continue;
    auto* rr = rec.add_ranks();
    rr->set_rank(static_cast<int>(i));
    rr->set_pipeline_rank(r.pipeline_rank);
    rr->set_data_parallel_rank(r.data_parallel_rank);
    rr->set_host(r.host);
    rr->set_device(r.device);
    rr->set_memory_capacity_bytes(r.memory_capacity_bytes);
  }
  return rec;
}

dynmo::v1::JobRecord JobState::Record() const {
  absl::MutexLock lock(&mu_);
  return RecordLocked();
}

absl::Status JobState::PersistLocked() {
  deps_.keeper->PutJob(RecordLocked());
  return deps_.keeper->Commit();
}

absl::Status JobState::Persist() {
  absl::MutexLock lock(&mu_);
  return PersistLocked();
}

}  // namespace dynmo::service
