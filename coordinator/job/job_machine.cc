#include "coordinator/job/job_machine.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/job/proto_convert.h"
#include "coordinator/job/upstream_checks.h"

namespace dynmo::service {
namespace {


template <typename Message>
JobShape ShapeOf(const std::string& name, const Message& m) {
  return JobShape{name,          m.pipeline_size(),     m.data_parallel_size(),
                  m.num_layers(), m.model_fingerprint(), m.planned_iterations()};
}

}  // namespace

JobMachine::JobMachine(JobShape shape, const JobOptions& options,
                       JobJournal* journal, uint64_t epoch, std::string owner)
    : name_(shape.job),
      owner_(std::move(owner)),
      options_(options),
      journal_(journal),
      roster_(shape),
      profile_(shape.data_parallel_size, shape.num_layers,
               core::CostProfileOptions{options.smoothing, options.noise_smoothing}),
      rebalancer_(options.default_policy, options.auto_options),
      plans_(PlanLifecycleOptions{name_, options.prepare_timeout,
                                  options.history_limit, options.plan_event_level},
             &roster_, &layout_, epoch),
      speeds_(name_, shape.pipeline_size * shape.data_parallel_size, shape.num_layers,
              options.speed, options.smoothing) {}

JobMachine::JobMachine(const dynmo::v1::RegisterRequest& first,
                       const JobOptions& options, JobJournal* journal,
                       std::string owner)
    // A rank that already ran plans (the coordinator lost its state dir)
    // sets the floor for the epochs: they must never go backwards.
    : JobMachine(ShapeOf(first.job(), first), options, journal,
                 first.applied_epoch(), std::move(owner)) {
  layout_ = StartingLayout(
      first.microbatches(), first.schedule(),
      {first.active_stages().begin(), first.active_stages().end()},
      {first.boundaries().begin(), first.boundaries().end()},
      first.pipeline_size(), first.num_layers());
}

JobMachine::JobMachine(const dynmo::v1::JobRecord& record,
                       const JobOptions& options, JobJournal* journal,
                       absl::Time now, JobEffects* out)
    : JobMachine(ShapeOf(record.name(), record), options, journal, 0, record.owner()) {
  layout_ = StartingLayout(
      record.microbatches(), record.schedule(),
      {record.active_stages().begin(), record.active_stages().end()},
      {record.boundaries().begin(), record.boundaries().end()},
      record.pipeline_size(), record.num_layers());
  rebalancer_.SetPolicy(PolicyFromProto(record.policy(), options.default_policy)
                            .value_or(options.default_policy));
  roster_.Restore(record);
  roster_.RestoreProgress(record.progress().last_iteration());
  rebalancer_.RestoreProgress(record.progress());
  reports_ = record.progress().reports();
  out->measures_changed = record.progress().stage_load_s_size() > 0;
  if (plans_.Restore(record, now)) ++out->plans_aborted;
}

JobParts JobMachine::Parts() const {
  return JobParts{roster_, plans_, layout_, rebalancer_, reports_, owner_};
}

absl::Status JobMachine::Register(
    absl::Span<const dynmo::v1::RegisterRequest* const> requests, absl::Time now,
    std::vector<dynmo::v1::RegisterResponse>* responses, JobEffects* out) {
  // Check all first: a refused batch registers no rank.
  for (const dynmo::v1::RegisterRequest* r : requests) {
    if (absl::Status s = roster_.CheckRegister(*r); !s.ok()) return s;
    if (absl::Status s = CheckRegisterEpochs(Parts(), *r, options_.epoch_window); !s.ok()) {
      return s;
    }
  }
  bool adopted = false;
  for (const dynmo::v1::RegisterRequest* r : requests) {
    PlanReady before = plans_.OnRegistering(*r, now);
    adopted = adopted || before.epoch_adopted;
    Carry(std::move(before), now, out).IgnoreError();  // never durable-first
    roster_.Register(*r);
    Carry(plans_.OnRegistered(*r, now), now, out).IgnoreError();
  }
  // Answered after all applied: one rank's adopted epoch and layout are
  // every rank's answer. Rank records become durable with the next plan,
  // which is before any of them can be released; only an adopted epoch must
  // be saved right away.
  responses->clear();
  for (const dynmo::v1::RegisterRequest* r : requests) {
    responses->push_back(MakeRegisterResponse(Parts(), r->rank()));
    responses->back().set_session_key(roster_.session_key(r->rank()));
  }
  return adopted ? Persist() : absl::OkStatus();
}

absl::Status JobMachine::Attach(absl::Span<const int> ranks,
                                absl::Span<const std::string> session_keys,
                                bool host, std::shared_ptr<SessionSink> sink,
                                JobEffects* out) {
  if (host) {
    if (absl::Status s = roster_.CheckAttachHost(ranks, session_keys, *sink); !s.ok()) {
      return s;
    }
  } else {
    if (ranks.size() != 1 || session_keys.size() != 1) {
      return absl::InvalidArgumentError("a one-rank session binds exactly one rank");
    }
    if (absl::Status s = roster_.CheckAttach(ranks[0], session_keys[0]); !s.ok()) {
      return s;
    }
  }
  // Closed after the caller's lock is released: gRPC may run OnDone inline,
  // and OnDone detaches from this job.
  for (auto& old : roster_.Attach(ranks, sink)) {
    out->closes.push_back({std::move(old), absl::AbortedError("superseded by a newer session")});
  }
  out->Append(plans_.OnAttach(sink, ranks).effects);
  return absl::OkStatus();
}

void JobMachine::Detach(absl::Span<const int> ranks, const SessionSink* sink) {
  roster_.Detach(ranks, sink);
}

absl::Status JobMachine::OnUpstream(absl::Span<const UpstreamMessage> messages,
                                    absl::Time now, JobEffects* out) {
  // Every message is checked, and each report's layers read, before any is
  // applied.
  std::vector<std::vector<core::LayerCost>> read(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    if (absl::Status s = CheckUpstream(Parts(), messages[i], options_.iteration_window, &read[i]);
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const UpstreamMessage& m = messages[i];
    if (m.ack != nullptr) {
      roster_.RecordAck(m.rank, m.ack->iteration());
      Carry(plans_.OnAck(m.rank, *m.ack, now), now, out).IgnoreError();  // a commit's own
      continue;
    }
    const dynmo::v1::IterationReport& report = *m.report;
    const RosterRank& r = roster_.at(m.rank);
    // A released stage holds no layers any more: its stragglers are ignored.
    const bool active = RankRoster::IsActiveStage(layout_.active_stages, r.pipeline_rank);
    std::vector<core::LayerCost>& layers = read[i];
    JobSpeeds::Reported speed;
    if (active) {
      speed = speeds_.OnReport(m.rank, report, layers, layout_.microbatches,
                               !plans_.AroundSwitch(report.iteration()), out);
    } else {
      layers.clear();
    }
    // A layer measured t on a rank of speed s costs t * s at speed 1.
    for (core::LayerCost& cost : layers) {
      cost.fwd_s *= speed.speed;
      cost.bwd_s *= speed.speed;
      cost.wgrad_s *= speed.speed;
      profile_.Add(r.data_parallel_rank, cost, speed.rebase).IgnoreError();
    }
    speeds_.OnStage(m.rank, r.data_parallel_rank, layers, profile_, options_.noise_smoothing,
                    speed.rebase);
    roster_.RecordReport(m.rank, report, active, report.model_changed() || speed.speed_moved);
    if (report.model_changed()) plans_.OnModelChange(m.rank, report.iteration());
    ++reports_;
    ++out->reports;
    Carry(plans_.OnReport(m.rank, report.iteration(), report.applied_epoch(),
                          report.iteration_s(), now),
          now, out)
        .IgnoreError();  // never durable-first
  }
  return absl::OkStatus();
}

absl::StatusOr<core::PipelineModel> JobMachine::ModelAt(
    const std::vector<double>& position_speeds) const {
  if (profile_.missing() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no complete profile of job ", name_, " yet: ", profile_.missing(),
        " of ", profile_.replicas() * profile_.num_layers(),
        " (replica, layer) samples missing"));
  }
  absl::StatusOr<core::PipelineModel> model = profile_.Model(core::PipelineShape{
      roster_.StageMemory(layout_.active_stages), layout_.boundaries,
      layout_.schedule, layout_.microbatches});
  if (!model.ok()) return model;
  // A stage runs at its slowest replica's speed.
  const size_t dp = static_cast<size_t>(std::max(1, roster_.shape().data_parallel_size));
  for (size_t i = 0; i < model->stages.size() && (i + 1) * dp <= position_speeds.size(); ++i) {
    model->stages[i].speed = *std::min_element(position_speeds.begin() + i * dp,
                                               position_speeds.begin() + (i + 1) * dp);
  }
  // Every stage's exchanges cost what the rank that waits least measured
  // (the bottleneck's are nearly all sending and receiving), at speed 1;
  // a one-stage pipeline exchanges nothing.
  const double exchange =
      model->stages.size() > 1 ? speeds_.Exchange(roster_, layout_) : 0.0;
  for (core::StageSpec& stage : model->stages) stage.exchange_s = exchange;
  return model;
}

dynmo::v1::JobStatus JobMachine::Status() const {
  dynmo::v1::JobStatus status = MakeJobStatus(Parts(), Model());
  for (double s : speeds_.ranks().speeds()) status.add_rank_speed(s);
  return status;
}

void JobMachine::Measure(const core::PipelineModel& model, JobEffects* out) {
  rebalancer_.Measure(model, layout_);
  out->measures_changed = true;
}

int64_t JobMachine::IterationsLeft() const {
  const int64_t planned = roster_.shape().planned_iterations;
  if (planned <= 0) return -1;
  return std::max<int64_t>(
      0, planned - (roster_.newest_iteration() + 1) - options_.plan_lead_iterations);
}

void JobMachine::Tick(absl::Time now, JobEffects* out) {
  if (plans_.in_flight() != nullptr) {
    Carry(plans_.OnTick(now, roster_.newest_iteration()), now, out).IgnoreError();
    return;
  }
  if (!rebalancer_.TakeDirty(reports_)) return;
  std::vector<double> speeds = PositionSpeeds();
  absl::StatusOr<core::PipelineModel> model = ModelAt(speeds);
  if (!model.ok()) return rebalancer_.Note(std::string(model.status().message()));
  Measure(*model, out);
  const std::vector<int>& active = layout_.active_stages;
  std::optional<Proposal> proposal = rebalancer_.Consider(RebalanceContext{
      *model, layout_, profile_, roster_.shape().pipeline_size,
      roster_.shape().data_parallel_size, roster_.CheckConnected(active).ok(),
      roster_.newest_iteration(), roster_.model_changes(), roster_.model_changed_iteration(),
      roster_.ReportedSince(active, roster_.model_changed_iteration()),
      std::move(speeds), IterationsLeft(), speeds_.Rising(roster_, layout_),
      plans_.predictions().size() > 0
          ? CalibratedMinGain(options_.auto_options, plans_.predictions())
          : -1.0,
      speeds_.Warming(roster_, layout_), speeds_.NoiseInflation(roster_, layout_),
      plans_.CurrentStepTime().value_or(0), plans_.MeasuringLayout(roster_.newest_iteration())});
  for (double s : rebalancer_.TakeDecisionLatencies()) out->decision_latency_s.push_back(s);
  if (!proposal) return;
  absl::StatusOr<dynmo::v1::Plan> issued =
      Issue(proposal->decision, proposal->reason, now, out);
  if (!issued.ok()) {
    rebalancer_.Note(absl::StrCat("plan not issued: ", issued.status().message()));
  }
}

absl::StatusOr<dynmo::v1::RebalanceResponse> JobMachine::Rebalance(absl::Time now,
                                                                   JobEffects* out) {
  if (absl::Status s = plans_.CheckIdle(); !s.ok()) return s;
  const std::vector<double> speeds = PositionSpeeds();
  absl::StatusOr<core::PipelineModel> model = ModelAt(speeds);
  if (!model.ok()) return model.status();
  if (absl::Status s = roster_.CheckConnected(layout_.active_stages); !s.ok()) {
    return s;
  }
  Measure(*model, out);
  dynmo::v1::RebalanceResponse response;
  absl::StatusOr<std::optional<Proposal>> proposal = rebalancer_.DecideNow(
      *model, layout_, roster_.shape().pipeline_size, roster_.shape().data_parallel_size,
      speeds, plans_.CurrentStepTime().value_or(0), response.mutable_detail());
  for (double s : rebalancer_.TakeDecisionLatencies()) out->decision_latency_s.push_back(s);
  if (!proposal.ok()) return proposal.status();
  if (!proposal->has_value()) return response;  // issued: false
  absl::StatusOr<dynmo::v1::Plan> plan =
      Issue((*proposal)->decision, (*proposal)->reason, now, out);
  if (!plan.ok()) return plan.status();
  response.set_issued(true);
  *response.mutable_plan() = *plan;
  response.set_detail(absl::StrCat("plan epoch ", plan->epoch(),
                                   " issued, applies at iteration ",
                                   plan->apply_iteration()));
  return response;
}

absl::StatusOr<dynmo::v1::Policy> JobMachine::SetPolicy(const dynmo::v1::Policy& proto) {
  absl::StatusOr<Policy> p = PolicyFromProto(proto, rebalancer_.policy());
  if (!p.ok()) return p.status();
  const Policy old = rebalancer_.policy();
  rebalancer_.SetPolicy(*p);
  if (absl::Status s = Persist(); !s.ok()) {
    rebalancer_.SetPolicy(old);
    return s;
  }
  rebalancer_.Rearm();  // re-evaluate under the new policy
  return PolicyToProto(*p);
}

}  // namespace dynmo::service
