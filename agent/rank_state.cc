#include "agent/rank_state.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "wire/layer_codec.h"

namespace dynmo::agent {
namespace {

using core::FiniteNonNegative;

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::PlanAck;

constexpr size_t kMaxQueuedAcks = 256;

}  // namespace

absl::Status ValidateRankConfig(const AgentConfig& c) {
  if (c.job.empty()) return absl::InvalidArgumentError("agent: no job name");
  if (c.pipeline_size < 1 || c.data_parallel_size < 1) {
    return absl::InvalidArgumentError("agent: sizes must be >= 1");
  }
  if (c.pipeline_rank < 0 || c.pipeline_rank >= c.pipeline_size ||
      c.data_parallel_rank < 0 || c.data_parallel_rank >= c.data_parallel_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("agent: rank ", c.rank, ": coordinates out of range"));
  }
  if (c.num_layers < c.pipeline_size) {
    return absl::InvalidArgumentError("agent: fewer layers than stages");
  }
  if (c.queue_capacity < 1) {
    return absl::InvalidArgumentError("agent: queue_capacity must be >= 1");
  }
  return absl::OkStatus();
}

RankState::RankState(const AgentConfig& config) : config_(config) {
  boundaries_ = config.boundaries;
  for (int s = 0; s < config.pipeline_size; ++s) active_stages_.push_back(s);
}

absl::Status RankState::Report(const IterationSample& s) {
  if (s.iteration < 0) {
    return absl::InvalidArgumentError("sample iteration is negative");
  }
  dynmo::v1::IterationReport r;
  r.set_iteration(s.iteration);
  for (const core::LayerCost& l : s.layers) {
    if (l.id < 0 || l.id >= config_.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer id ", l.id, " outside [0, ", config_.num_layers, ")"));
    }
    if (!FiniteNonNegative(l.fwd_s) || !FiniteNonNegative(l.bwd_s) ||
        !FiniteNonNegative(l.wgrad_s) || l.params < 0 ||
        l.resident_bytes < 0 || l.activation_bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l.id, ": times and sizes must be finite and >= 0"));
    }
    wire::LayerCostToSample(l, r.add_layers());
  }
  if (s.memory_used_bytes < 0 || s.memory_capacity_bytes < 0 ||
      !FiniteNonNegative(s.neighbour_wait_s) || !FiniteNonNegative(s.probe_s) ||
      !FiniteNonNegative(s.exchange_s) || !FiniteNonNegative(s.iteration_s)) {
    return absl::InvalidArgumentError(
        "memory must be >= 0 and neighbour_wait_s, probe_s, exchange_s and iteration_s "
        "finite and >= 0");
  }
  r.set_stage_memory_used_bytes(s.memory_used_bytes);
  r.set_stage_memory_capacity_bytes(s.memory_capacity_bytes);
  r.set_neighbour_wait_s(s.neighbour_wait_s);
  r.set_model_changed(s.model_changed);
  r.set_probe_s(s.probe_s);
  r.set_exchange_s(s.exchange_s);
  r.set_iteration_s(s.iteration_s);
  r.set_applied_epoch(applied_epoch_);
  last_iteration_ = std::max(last_iteration_, s.iteration);
  // The trainer ran the plan's apply iteration without switching.
  if (pending_ && s.iteration >= pending_->apply_iteration()) {
    FailPending("apply iteration passed without the plan applied");
  }
  out_.reports.push_back(std::move(r));
  while (out_.reports.size() > config_.queue_capacity) {
    out_.reports.pop_front();
    ++stats_.samples_dropped;
  }
  return absl::OkStatus();
}

std::optional<dynmo::v1::Plan> RankState::LatestCommitted() const {
  if (pending_ && committed_) return *pending_;
  return applied_plan_;
}

std::optional<dynmo::v1::Plan> RankState::DueAt(int64_t iteration) {
  if (!pending_ || pending_->apply_iteration() > iteration) return std::nullopt;
  if (pending_->apply_iteration() < iteration) {
    FailPending("apply iteration was skipped");
    return std::nullopt;
  }
  if (!committed_) {
    FailPending("not committed by its apply iteration");
    return std::nullopt;
  }
  return *pending_;
}

absl::Status RankState::Acknowledge(uint64_t epoch, bool applied,
                                    const std::string& detail) {
  if (!pending_ || pending_->epoch() != epoch) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch, " is not the pending plan of rank ",
                     config_.rank));
  }
  if (applied && !committed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch, " was never committed"));
  }
  if (!applied) {
    FailPending(detail.empty() ? "the trainer did not switch" : detail);
    return absl::OkStatus();
  }
  applied_epoch_ = epoch;
  if (pending_->has_reshape()) Reposition(pending_->reshape());
  boundaries_.assign(pending_->boundaries().begin(),
                     pending_->boundaries().end());
  active_stages_.assign(pending_->active_stages().begin(),
                        pending_->active_stages().end());
  released_ = std::find(active_stages_.begin(), active_stages_.end(),
                        config_.pipeline_rank) == active_stages_.end();
  applied_plan_ = std::move(*pending_);
  pending_.reset();
  settled_epoch_ = epoch;
  settled_applied_ = true;
  ++stats_.plans_applied;
  QueueAck(epoch, PlanAck::APPLIED, detail);
  return absl::OkStatus();
}

void RankState::QueueAck(uint64_t epoch, PlanAck::State state,
                         const std::string& detail) {
  PlanAck a;
  a.set_epoch(epoch);
  a.set_state(state);
  a.set_iteration(last_iteration_);
  a.set_detail(detail);
  out_.acks.push_back(std::move(a));
  ++unsent_acks_;
  while (out_.acks.size() > kMaxQueuedAcks) {
    out_.acks.pop_front();
    --unsent_acks_;
  }
}

void RankState::FailPending(const std::string& why) {
  const uint64_t e = pending_->epoch();
  pending_.reset();
  committed_ = false;
  settled_epoch_ = e;
  settled_applied_ = false;
  ++stats_.plans_failed;
  QueueAck(e, PlanAck::FAILED, why);
}

void RankState::HandleDown(const CoordinatorMessage& m) {
  switch (m.kind_case()) {
    case CoordinatorMessage::kPrepare: {
      const dynmo::v1::Plan& plan = m.prepare();
      const uint64_t e = plan.epoch();
      if (e <= settled_epoch_ || e <= applied_epoch_) {
        // Settled before: repeat the verdict, never act twice.
        if (e == settled_epoch_) {
          QueueAck(e, settled_applied_ ? PlanAck::APPLIED : PlanAck::FAILED,
                   "duplicate");
        }
        return;
      }
      if (pending_ && pending_->epoch() == e) {
        QueueAck(e, PlanAck::PREPARED, "duplicate");
        return;
      }
      if (pending_ && pending_->epoch() > e) return;  // late, stale
      if (pending_) FailPending("superseded by a newer epoch");
      if (last_iteration_ + 1 > plan.apply_iteration()) {
        settled_epoch_ = e;
        settled_applied_ = false;
        ++stats_.plans_failed;
        QueueAck(e, PlanAck::FAILED,
                 absl::StrCat("already at iteration ", last_iteration_ + 1,
                              ", past apply iteration ",
                              plan.apply_iteration()));
        return;
      }
      pending_ = plan;
      const int64_t now = absl::ToUnixNanos(absl::Now());
      stats_.last_prepare_epoch = e;
      stats_.last_prepare_unix_nanos = now;
      committed_ = plan.commit_with_prepare();
      if (committed_) {
        stats_.last_commit_epoch = e;
        stats_.last_commit_unix_nanos = now;
      }
      ++stats_.plans_prepared;
      QueueAck(e, PlanAck::PREPARED, "");
      return;
    }
    case CoordinatorMessage::kCommit:
      if (pending_ && pending_->epoch() == m.commit().epoch() && !committed_) {
        committed_ = true;
        stats_.last_commit_epoch = m.commit().epoch();
        stats_.last_commit_unix_nanos = absl::ToUnixNanos(absl::Now());
      }
      return;
    case CoordinatorMessage::kAbort:
      if (pending_ && pending_->epoch() == m.abort().epoch()) {
        pending_.reset();
        committed_ = false;
        settled_epoch_ = m.abort().epoch();
        settled_applied_ = false;
        ++stats_.plans_failed;
      }
      return;
    default:
      return;
  }
}

void RankState::Reposition(const dynmo::v1::Reshape& reshape) {
  const int dp = std::max(1, reshape.data_parallel_size());
  const int position = config_.pipeline_rank * config_.data_parallel_size +
                       config_.data_parallel_rank;
  const int global = config_.microbatches * config_.data_parallel_size;
  config_.pipeline_size = reshape.pipeline_size();
  config_.data_parallel_size = dp;
  config_.pipeline_rank = position / dp;
  config_.data_parallel_rank = position % dp;
  config_.microbatches = std::max(1, global / dp);
}

dynmo::v1::RegisterRequest RankState::MakeRegisterRequest() const {
  dynmo::v1::RegisterRequest r;
  r.set_job(config_.job);
  r.set_rank(config_.rank);
  r.set_pipeline_rank(config_.pipeline_rank);
  r.set_data_parallel_rank(config_.data_parallel_rank);
  r.set_pipeline_size(config_.pipeline_size);
  r.set_data_parallel_size(config_.data_parallel_size);
  r.set_host(config_.host);
  r.set_device(config_.device);
  r.set_memory_capacity_bytes(config_.memory_capacity_bytes);
  r.set_num_layers(config_.num_layers);
  for (int b : boundaries_) r.add_boundaries(b);
  if (static_cast<int>(active_stages_.size()) != config_.pipeline_size) {
    for (int s : active_stages_) r.add_active_stages(s);
  }
  r.set_model_fingerprint(config_.model_fingerprint);
  r.set_applied_epoch(applied_epoch_);
  if (pending_) r.set_pending_epoch(pending_->epoch());
  r.set_microbatches(config_.microbatches);
  r.set_schedule(config_.schedule);
  r.set_planned_iterations(config_.planned_iterations);
  return r;
}

void RankState::OnRegistered(const dynmo::v1::RegisterResponse& response) {
  released_ = response.released();
  session_key_ = response.session_key();
}

AgentStats RankState::Stats(bool connected) const {
  AgentStats s = stats_;
  s.connected = connected;
  s.applied_epoch = applied_epoch_;
  s.boundaries = boundaries_;
  s.active_stages = active_stages_;
  s.released = released_;
  return s;
}

}  // namespace dynmo::agent
