#include "coordinator/job/job_record.h"

#include "coordinator/job/proto_convert.h"
#include "wire/layer_codec.h"

namespace dynmo::service {

dynmo::v1::JobRecord MakeJobRecord(const JobParts& job) {
  dynmo::v1::JobRecord rec;
  job.roster.ToRecord(&rec);
  job.plans.ToRecord(&rec);
  rec.set_owner(job.owner);
  rec.set_microbatches(job.layout.microbatches);
  rec.set_schedule(core::ScheduleName(job.layout.schedule));
  *rec.mutable_policy() = PolicyToProto(job.rebalancer.policy());
  for (int b : job.layout.boundaries) rec.add_boundaries(b);
  for (int s : job.layout.active_stages) rec.add_active_stages(s);
  job.rebalancer.SaveProgress(rec.mutable_progress());
  rec.mutable_progress()->set_last_iteration(job.roster.newest_iteration());
  rec.mutable_progress()->set_reports(job.reports);
  return rec;
}

dynmo::v1::JobSummary MakeJobSummary(const JobParts& job) {
  const JobShape& shape = job.roster.shape();
  const int active = static_cast<int>(job.layout.active_stages.size());
  dynmo::v1::JobSummary s;
  s.set_name(shape.job);
  s.set_owner(job.owner);
  s.set_pipeline_size(shape.pipeline_size);
  s.set_data_parallel_size(shape.data_parallel_size);
  s.set_num_layers(shape.num_layers);
  s.set_connected_ranks(job.roster.connected());
  s.set_epoch(job.plans.epoch());
  s.set_applied_epoch(job.plans.applied_epoch());
  s.set_last_iteration(job.roster.newest_iteration());
  s.set_imbalance(job.rebalancer.measures().imbalance);
  s.set_bottleneck_s(job.rebalancer.measures().bottleneck);
  s.set_active_stages(active);
  s.set_released_stages(shape.pipeline_size - active);
  *s.mutable_policy() = PolicyToProto(job.rebalancer.policy());
  s.set_plan_state(job.plans.StateName());
  s.set_reports(job.reports);
  return s;
}

dynmo::v1::JobStatus MakeJobStatus(
    const JobParts& job, const absl::StatusOr<core::PipelineModel>& model) {
  dynmo::v1::JobStatus st;
  *st.mutable_summary() = MakeJobSummary(job);
  for (int b : job.layout.boundaries) st.add_boundaries(b);
  for (int s : job.layout.active_stages) st.add_active_stages(s);
  for (double l : job.rebalancer.measures().loads) st.add_stage_load_s(l);
  st.set_lower_bound_s(job.rebalancer.measures().lower_bound);
  st.set_predicted_bubble_ratio(job.rebalancer.bubble());
  st.set_note(job.rebalancer.note());
  for (const auto& h : job.plans.history()) *st.add_history() = h;
  if (job.plans.in_flight() != nullptr) {
    *st.add_history() = *job.plans.in_flight();
  }
  if (model.ok()) {
    for (const core::LayerCost& c : model->layers) {
      *st.add_layers() = wire::LayerSampleFromCost(c);
    }
    for (const core::StageSpec& s : model->stages) {
      st.add_stage_memory_cap_bytes(s.capacity_bytes);
    }
  }
  for (const core::StageMemoryReport& m :
       job.roster.StageMemory(job.layout.active_stages)) {
    st.add_stage_memory_used_bytes(m.used_bytes);
  }
  return st;
}

std::vector<dynmo::v1::GpuPlacement> MakePlacements(const JobParts& job) {
  std::vector<dynmo::v1::GpuPlacement> out;
  for (int r = 0; r < job.roster.size(); ++r) {
    const RosterRank& rank = job.roster.at(r);
    if (!rank.registered) continue;
    dynmo::v1::GpuPlacement p;
    p.set_job(job.roster.shape().job);
    p.set_rank(r);
    p.set_host(rank.host);
    p.set_device(rank.device);
    const bool released =
        !RankRoster::IsActiveStage(job.layout.active_stages, rank.pipeline_rank);
    p.set_released(released);
    p.set_stage(released ? -1 : rank.pipeline_rank);
    p.set_replica(released ? -1 : rank.data_parallel_rank);
    p.set_epoch(job.plans.applied_epoch());
    out.push_back(std::move(p));
  }
  return out;
}

dynmo::v1::RegisterResponse MakeRegisterResponse(const JobParts& job, int rank) {
  dynmo::v1::RegisterResponse response;
  response.set_epoch(job.plans.epoch());
  response.set_applied_epoch(job.plans.applied_epoch());
  for (int b : job.layout.boundaries) response.add_boundaries(b);
  for (int s : job.layout.active_stages) response.add_active_stages(s);
  response.set_released(!RankRoster::IsActiveStage(
      job.layout.active_stages, job.roster.at(rank).pipeline_rank));
  return response;
}

}  // namespace dynmo::service
