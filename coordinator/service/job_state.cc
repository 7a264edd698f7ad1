#include "coordinator/service/job_state.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/service/job_record.h"
#include "coordinator/service/plan_convert.h"
#include "coordinator/service/proto_convert.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;

template <typename Message>
JobShape ShapeOf(const std::string& name, const Message& m) {
  return JobShape{name, m.pipeline_size(), m.data_parallel_size(),
                  m.num_layers(), m.model_fingerprint()};
}

}  // namespace

class JobState::FlushOnExit {
 public:
  explicit FlushOnExit(JobState* job) : job_(job) {}
  ~FlushOnExit() { job_->outbox_.Deliver(); }

 private:
  JobState* job_;
};

JobState::JobState(JobShape shape, const JobOptions& options, JobDeps deps,
                   uint64_t epoch, std::string owner)
    : name_(shape.job),
      owner_(std::move(owner)),
      deps_(deps),
      metrics_(deps.metrics != nullptr ? deps.metrics->ForJob(name_) : nullptr),
      options_(options),
      roster_(shape),
      profile_(shape.data_parallel_size, shape.num_layers,
               core::CostProfileOptions{options.smoothing, options.noise_smoothing}),
      rebalancer_(options.default_policy, options.auto_options, deps.metrics),
      protocol_(PlanProtocolOptions{name_, options.prepare_timeout,
                                    options.history_limit},
                shape.pipeline_size * shape.data_parallel_size, epoch) {}

JobState::JobState(const dynmo::v1::RegisterRequest& first,
                   const JobOptions& options, JobDeps deps, std::string owner)
    // A rank that already ran plans (the coordinator lost its state dir)
    // sets the floor for the epochs: they must never go backwards.
    : JobState(ShapeOf(first.job(), first), options, deps, first.applied_epoch(),
               std::move(owner)) {
  absl::MutexLock lock(&mu_);
  layout_ = StartingLayout(
      first.microbatches(), first.schedule(),
      {first.active_stages().begin(), first.active_stages().end()},
      {first.boundaries().begin(), first.boundaries().end()},
      first.pipeline_size(), first.num_layers());
}

JobState::JobState(const dynmo::v1::JobRecord& record,
                   const JobOptions& options, JobDeps deps)
    : JobState(ShapeOf(record.name(), record), options, deps, 0, record.owner()) {
  absl::MutexLock lock(&mu_);
  layout_ = StartingLayout(
      record.microbatches(), record.schedule(),
      {record.active_stages().begin(), record.active_stages().end()},
      {record.boundaries().begin(), record.boundaries().end()},
      record.pipeline_size(), record.num_layers());
  rebalancer_.SetPolicy(PolicyFromProto(record.policy(), options.default_policy)
                            .value_or(options.default_policy));
  roster_.Restore(record);
  rebalancer_.RestoreProgress(record.progress());
  reports_ = record.progress().reports();
  if (record.progress().stage_load_s_size() > 0) PublishMeasuresLocked();
  const bool aborted = protocol_.Restore(record, absl::Now());
  if (aborted && metrics_ != nullptr) metrics_->PlanAborted();
}

absl::Status JobState::Register(const dynmo::v1::RegisterRequest& request,
                                dynmo::v1::RegisterResponse* response) {
  google::protobuf::RepeatedPtrField<dynmo::v1::RegisterRequest> one;
  *one.Add() = request;
  std::vector<dynmo::v1::RegisterResponse> responses;
  absl::Status s = RegisterMany(one, &responses);
  if (s.ok()) *response = std::move(responses.front());
  return s;
}

absl::Status JobState::RegisterMany(
    const google::protobuf::RepeatedPtrField<dynmo::v1::RegisterRequest>& requests,
    std::vector<dynmo::v1::RegisterResponse>* responses) {
  FlushOnExit flush(this);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  // Check all first: a refused batch registers no rank.
  for (const auto& r : requests) {
    if (absl::Status s = roster_.CheckRegister(r); !s.ok()) return s;
    if (absl::Status s = CheckRegisterEpochsLocked(r); !s.ok()) return s;
  }
  bool adopted = false;
  for (const auto& r : requests) adopted = ApplyRegisterLocked(r) || adopted;
  // Answered after all applied: one rank's adopted epoch and layout are
  // every rank's answer. Rank records become durable with the next plan,
  // which is before any of them can be released; only an adopted epoch must
  // be saved right away.
  responses->assign(static_cast<size_t>(requests.size()),
                    dynmo::v1::RegisterResponse{});
  for (int i = 0; i < requests.size(); ++i) {
    (*responses)[static_cast<size_t>(i)] =
        MakeRegisterResponse(PartsLocked(), requests[i].rank());
    (*responses)[static_cast<size_t>(i)].set_session_key(
        roster_.session_key(requests[i].rank()));
  }
  return adopted ? PersistLocked() : absl::OkStatus();
}

bool JobState::ApplyRegisterLocked(const dynmo::v1::RegisterRequest& request) {
  bool adopted = false;
  if (request.applied_epoch() > protocol_.epoch()) {
    adopted = true;
    // The state dir was lost or is older than the ranks: adopt the rank's
    // epoch and layout so that the next plan is newer than anything applied.
    protocol_.AdoptEpoch(request.applied_epoch());
    if (request.boundaries_size() > 0) {
      SetStages({request.active_stages().begin(), request.active_stages().end()},
                {request.boundaries().begin(), request.boundaries().end()},
                request.pipeline_size(), request.num_layers(), &layout_);
    }
  } else {
    AdoptAppliedLocked(request.rank(), request.applied_epoch(), &request);
  }
  roster_.Register(request);
  if (RankRoster::IsActiveStage(layout_.active_stages, request.pipeline_rank())) {
    RunStepLocked(protocol_.OnRegister(request.rank(), request.applied_epoch(),
                                       request.pending_epoch()));
  }
  return adopted;
}

absl::Status JobState::Attach(int rank, absl::string_view session_key,
                              std::shared_ptr<SessionSink> sink) {
  FlushOnExit flush(this);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  if (absl::Status s = roster_.CheckAttach(rank, session_key); !s.ok()) return s;
  const int one[] = {rank};
  // Closed after the lock is released: gRPC may run OnDone inline, and
  // OnDone detaches from this job.
  for (const auto& old : roster_.Attach(one, sink)) outbox_.Close(old);
  ResendInFlight(sink, one);
  return absl::OkStatus();
}

absl::Status JobState::AttachHost(absl::Span<const int> ranks,
                                  absl::Span<const std::string> session_keys,
                                  std::shared_ptr<SessionSink> sink) {
  FlushOnExit flush(this);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  if (absl::Status s = roster_.CheckAttachHost(ranks, session_keys, *sink); !s.ok()) {
    return s;
  }
  for (const auto& old : roster_.Attach(ranks, sink)) outbox_.Close(old);
  ResendInFlight(sink, ranks);
  return absl::OkStatus();
}

void JobState::Detach(int rank, const SessionSink* sink) {
  const int one[] = {rank};
  DetachHost(one, sink);
}

void JobState::DetachHost(absl::Span<const int> ranks, const SessionSink* sink) {
  absl::MutexLock lock(&mu_);
  roster_.Detach(ranks, sink);
  last_activity_ = absl::Now();
}

absl::Status JobState::OnReport(int rank,
                                const dynmo::v1::IterationReport& report) {
  const Upstream one[] = {{rank, &report, nullptr}};
  return OnUpstream(one);
}

absl::Status JobState::OnAck(int rank, const dynmo::v1::PlanAck& ack) {
  const Upstream one[] = {{rank, nullptr, &ack}};
  return OnUpstream(one);
}

absl::Status JobState::OnHostBatch(const dynmo::v1::HostBatch& batch) {
  std::vector<Upstream> messages;
  messages.reserve(static_cast<size_t>(batch.messages_size()));
  for (const auto& m : batch.messages()) {
    messages.push_back({m.rank(), m.has_report() ? &m.report() : nullptr,
                        m.has_ack() ? &m.ack() : nullptr});
  }
  return OnUpstream(messages);
}

absl::Status JobState::OnUpstream(absl::Span<const Upstream> messages) {
  FlushOnExit flush(this);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  for (const Upstream& m : messages) {
    if (absl::Status s = CheckLocked(m); !s.ok()) return s;
  }
  for (const Upstream& m : messages) {
    if (m.report != nullptr) {
      ApplyReportLocked(m.rank, *m.report);
    } else {
      ApplyAckLocked(m.rank, *m.ack);
    }
  }
  return absl::OkStatus();
}

void JobState::ApplyReportLocked(int rank,
                                 const dynmo::v1::IterationReport& report) {
  const RosterRank& r = roster_.at(rank);
  // A released stage holds no layers any more; its stragglers are ignored.
  const bool active = RankRoster::IsActiveStage(layout_.active_stages, r.pipeline_rank);
  for (const auto& l : report.layers()) {
    if (!active) break;
    // CheckLocked validated the layers against the job's.
    profile_.Add(r.data_parallel_rank, LayerCostFromSample(l), report.model_changed())
        .IgnoreError();
  }
  roster_.RecordReport(rank, report, active);
  rebalancer_.OnReport(report.iteration(), report.model_changed());
  AdoptAppliedLocked(rank, report.applied_epoch(), nullptr);
  ++reports_;
  if (metrics_ != nullptr) metrics_->Report();
  if (roster_.Participates(rank, layout_.active_stages)) {
    RunStepLocked(protocol_.OnReport(rank, report.iteration(), report.applied_epoch()));
  }
}

void JobState::ApplyAckLocked(int rank, const dynmo::v1::PlanAck& ack) {
  roster_.RecordAck(rank, ack.iteration());
  const RosterRank& r = roster_.at(rank);
  const PlanStep step =
      protocol_.OnAck(rank, roster_.Participates(rank, layout_.active_stages), ack);
  if (step.kind == PlanStep::Kind::kResendCommit) {
    // Only the COMMIT: re-sending the PREPARE would draw another PREPARED.
    if (r.sink != nullptr) {
      outbox_.Queue(r.sink, {rank}, std::make_shared<const CoordinatorMessage>(
                                        protocol_.CommitMessage()));
    }
    return;
  }
  RunStepLocked(step);
}

absl::StatusOr<core::PipelineModel> JobState::ModelLocked() const {
  if (profile_.missing() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no complete profile of job ", name_, " yet: ", profile_.missing(),
        " of ", profile_.replicas() * profile_.num_layers(),
        " (replica, layer) samples missing"));
  }
  return profile_.Model(core::PipelineShape{
      roster_.StageMemory(layout_.active_stages), layout_.boundaries,
      layout_.schedule, layout_.microbatches});
}

void JobState::MeasureLocked(const core::PipelineModel& model) {
  rebalancer_.Measure(model, layout_);
  PublishMeasuresLocked();
}

void JobState::PublishMeasuresLocked() {
  if (metrics_ == nullptr) return;
  const core::PartitionSummary& m = rebalancer_.measures();
  const int dp = roster_.shape().data_parallel_size;
  const int active = static_cast<int>(layout_.active_stages.size());
  metrics_->SetStageLoads(layout_.active_stages, m.loads);
  metrics_->SetMeasures(m.imbalance, m.bottleneck, m.lower_bound,
                        rebalancer_.bubble());
  metrics_->SetGpus(dp * active, dp * (roster_.shape().pipeline_size - active));
}

void JobState::Tick(absl::Time now) {
  FlushOnExit flush(this);
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  if (protocol_.in_flight() != nullptr) {
    RunStepLocked(protocol_.OnTick(now, rebalancer_.newest_iteration()));
    return;
  }
  if (!rebalancer_.TakeDirty()) return;
  absl::StatusOr<core::PipelineModel> model = ModelLocked();
  if (!model.ok()) return rebalancer_.Note(std::string(model.status().message()));
  MeasureLocked(*model);
  const std::vector<int>& active = layout_.active_stages;
  std::optional<Proposal> proposal = rebalancer_.Consider(RebalanceContext{
      *model, layout_, profile_, roster_.shape().pipeline_size,
      roster_.shape().data_parallel_size, roster_.CheckConnected(active).ok(),
      roster_.ReportedSince(active, rebalancer_.model_changed_iteration())});
  if (!proposal) return;
  absl::StatusOr<dynmo::v1::Plan> issued =
      IssueLocked(proposal->decision, proposal->reason, now);
  if (!issued.ok()) {
    rebalancer_.Note(absl::StrCat("plan not issued: ", issued.status().message()));
  }
}

absl::StatusOr<dynmo::v1::RebalanceResponse> JobState::Rebalance(absl::Time now) {
  FlushOnExit flush(this);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  if (absl::Status s = protocol_.CheckIdle(); !s.ok()) return s;
  absl::StatusOr<core::PipelineModel> model = ModelLocked();
  if (!model.ok()) return model.status();
  if (absl::Status s = roster_.CheckConnected(layout_.active_stages); !s.ok()) {
    return s;
  }
  MeasureLocked(*model);
  dynmo::v1::RebalanceResponse response;
  absl::StatusOr<std::optional<Proposal>> proposal = rebalancer_.DecideNow(
      *model, layout_, roster_.shape().pipeline_size, roster_.shape().data_parallel_size,
      response.mutable_detail());
  if (!proposal.ok()) return proposal.status();
  if (!proposal->has_value()) return response;  // issued: false
  absl::StatusOr<dynmo::v1::Plan> plan =
      IssueLocked((*proposal)->decision, (*proposal)->reason, now);
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
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  absl::StatusOr<Policy> p = PolicyFromProto(proto, rebalancer_.policy());
  if (!p.ok()) return p.status();
  const Policy old = rebalancer_.policy();
  rebalancer_.SetPolicy(*p);
  if (absl::Status s = PersistLocked(); !s.ok()) {
    rebalancer_.SetPolicy(old);
    return s;
  }
  rebalancer_.Rearm();  // re-evaluate under the new policy
  return PolicyToProto(*p);
}

absl::Status JobState::PersistLocked() {
  return deps_.keeper->CommitJob(MakeJobRecord(PartsLocked()));
}

void JobState::PersistSettledLocked() {
  if (absl::Status s = PersistLocked(); !s.ok()) {
    rebalancer_.Note(std::string(s.message()));  // "state not persisted (...)"
  }
}

absl::Status JobState::Persist() {
  absl::MutexLock lock(&mu_);
  return PersistLocked();
}

}  // namespace dynmo::service
