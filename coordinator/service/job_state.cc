#include "coordinator/service/job_state.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dynmo::service {

JobState::JobState(const dynmo::v1::RegisterRequest& first,
                   const JobOptions& options, JobDeps deps, std::string owner)
    : name_(first.job()),
      owner_(std::move(owner)),
      deps_(deps),
      metrics_(deps.metrics != nullptr ? deps.metrics->ForJob(name_) : nullptr) {
  absl::MutexLock lock(&mu_);
  machine_ = std::make_unique<JobMachine>(first, options, deps_.keeper, owner_);
}

JobState::JobState(const dynmo::v1::JobRecord& record,
                   const JobOptions& options, JobDeps deps)
    : name_(record.name()),
      owner_(record.owner()),
      deps_(deps),
      metrics_(deps.metrics != nullptr ? deps.metrics->ForJob(name_) : nullptr) {
  Delivery delivery(&delivery_order_);
  absl::MutexLock lock(&mu_);
  JobEffects effects;
  machine_ = std::make_unique<JobMachine>(record, options, deps_.keeper, absl::Now(),
                                          &effects);
  CarryLocked(effects, &delivery);
}

void JobState::CarryLocked(JobEffects& fx, Delivery* delivery) {
  delivery->Take(fx);
  for (const JobEvent& e : fx.events) LogEvent(e.level, e.name, e.fields);
  if (deps_.metrics != nullptr) {
    for (double s : fx.decision_latency_s) deps_.metrics->DecisionLatency(s);
  }
  if (metrics_ != nullptr) {
    for (int i = 0; i < fx.reports; ++i) metrics_->Report();
    for (int i = 0; i < fx.plans_issued; ++i) metrics_->PlanIssued();
    for (int i = 0; i < fx.plans_aborted; ++i) metrics_->PlanAborted();
    for (int i = 0; i < fx.plans_applied; ++i) metrics_->PlanApplied();
    if (fx.migrated_bytes > 0) metrics_->Migrated(fx.migrated_bytes);
    for (const JobEffects::PlanGain& g : fx.gains) {
      metrics_->PlanGain(g.predicted, g.realized, g.model_changed);
    }
  }
  if (fx.measures_changed || fx.plans_applied > 0) PublishMeasuresLocked();
  if (fx.speeds_changed && metrics_ != nullptr) {
    metrics_->SetRankSpeeds(machine_->speeds().speeds());
  }
  if (fx.released.empty()) return;
  // The job record is committed; the pool commits its own record.
  if (absl::Status s = deps_.pool->Add(std::move(fx.released)); !s.ok()) {
    machine_->Note(absl::StrCat("released GPUs not persisted: ", s.message()));
  }
}

void JobState::PublishMeasuresLocked() {
  if (metrics_ == nullptr) return;
  const core::PartitionSummary& m = machine_->rebalancer().measures();
  const JobShape& shape = machine_->roster().shape();
  const std::vector<int>& active = machine_->layout().active_stages;
  const int dp = shape.data_parallel_size;
  const int n = static_cast<int>(active.size());
  metrics_->SetStageLoads(active, m.loads);
  metrics_->SetMeasures(m.imbalance, m.bottleneck, m.lower_bound,
                        machine_->rebalancer().bubble());
  metrics_->SetGpus(dp * n, dp * (shape.pipeline_size - n));
  // Every rank's speed, 1 until its probes say otherwise.
  metrics_->SetRankSpeeds(machine_->speeds().speeds());
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
  Delivery delivery(&delivery_order_);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  std::vector<const dynmo::v1::RegisterRequest*> all;
  for (const auto& r : requests) all.push_back(&r);
  JobEffects effects;
  absl::Status s = machine_->Register(all, absl::Now(), responses, &effects);
  CarryLocked(effects, &delivery);
  return s;
}

absl::Status JobState::Attach(int rank, absl::string_view session_key,
                              std::shared_ptr<SessionSink> sink) {
  Delivery delivery(&delivery_order_);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  const int ranks[] = {rank};
  const std::string keys[] = {std::string(session_key)};
  JobEffects effects;
  absl::Status s = machine_->Attach(ranks, keys, /*host=*/false, std::move(sink), &effects);
  CarryLocked(effects, &delivery);
  return s;
}

absl::Status JobState::AttachHost(absl::Span<const int> ranks,
                                  absl::Span<const std::string> session_keys,
                                  std::shared_ptr<SessionSink> sink) {
  Delivery delivery(&delivery_order_);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  JobEffects effects;
  absl::Status s =
      machine_->Attach(ranks, session_keys, /*host=*/true, std::move(sink), &effects);
  CarryLocked(effects, &delivery);
  return s;
}

void JobState::Detach(int rank, const SessionSink* sink) {
  const int one[] = {rank};
  DetachHost(one, sink);
}

void JobState::DetachHost(absl::Span<const int> ranks, const SessionSink* sink) {
  absl::MutexLock lock(&mu_);
  machine_->Detach(ranks, sink);
  last_activity_ = absl::Now();
}

absl::Status JobState::OnReport(int rank,
                                const dynmo::v1::IterationReport& report) {
  const UpstreamMessage one[] = {{rank, &report, nullptr}};
  return OnUpstream(one);
}

absl::Status JobState::OnAck(int rank, const dynmo::v1::PlanAck& ack) {
  const UpstreamMessage one[] = {{rank, nullptr, &ack}};
  return OnUpstream(one);
}

absl::Status JobState::OnHostBatch(const dynmo::v1::HostBatch& batch) {
  std::vector<UpstreamMessage> messages;
  messages.reserve(static_cast<size_t>(batch.messages_size()));
  for (const auto& m : batch.messages()) {
    messages.push_back({m.rank(), m.has_report() ? &m.report() : nullptr,
                        m.has_ack() ? &m.ack() : nullptr});
  }
  return OnUpstream(messages);
}

absl::Status JobState::OnUpstream(absl::Span<const UpstreamMessage> messages) {
  Delivery delivery(&delivery_order_);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  JobEffects effects;
  absl::Status s = machine_->OnUpstream(messages, absl::Now(), &effects);
  CarryLocked(effects, &delivery);
  return s;
}

void JobState::Tick(absl::Time now) {
  Delivery delivery(&delivery_order_);
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  JobEffects effects;
  machine_->Tick(now, &effects);
  CarryLocked(effects, &delivery);
}

absl::StatusOr<dynmo::v1::RebalanceResponse> JobState::Rebalance(absl::Time now) {
  Delivery delivery(&delivery_order_);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  JobEffects effects;
  absl::StatusOr<dynmo::v1::RebalanceResponse> r = machine_->Rebalance(now, &effects);
  CarryLocked(effects, &delivery);
  return r;
}

absl::StatusOr<dynmo::v1::Policy> JobState::SetPolicy(const dynmo::v1::Policy& proto) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(); !s.ok()) return s;
  return machine_->SetPolicy(proto);
}

absl::Status JobState::Persist() {
  absl::MutexLock lock(&mu_);
  return machine_->Persist();
}

dynmo::v1::JobSummary JobState::Summary() const {
  absl::MutexLock lock(&mu_);
  return machine_->Summary();
}

dynmo::v1::JobStatus JobState::Status() const {
  absl::MutexLock lock(&mu_);
  return machine_->Status();
}

std::vector<dynmo::v1::GpuPlacement> JobState::Placements() const {
  absl::MutexLock lock(&mu_);
  return machine_->Placements();
}

dynmo::v1::JobRecord JobState::Record() const {
  absl::MutexLock lock(&mu_);
  return machine_->Record();
}

}  // namespace dynmo::service
