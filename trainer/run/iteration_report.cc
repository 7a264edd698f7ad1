#include "trainer/run/iteration_report.h"

#include <cmath>

#include "trainer/comm/device.h"
#include "trainer/stage/stage_memory.h"

namespace dynmo::trainer {
namespace {

// Offsets of the summary's per-layer blocks.
struct Slots {
  int layers;
  int forward(int l) const { return 1 + l; }
  int backward(int l) const { return 1 + layers + l; }
  int resident(int l) const { return 1 + 2 * layers + l; }
  int weight_grad(int l) const { return 1 + 3 * layers + l; }
  int activation(int l) const { return 1 + 4 * layers + l; }
  int params(int l) const { return 1 + 5 * layers + l; }
  int memory(int stage) const { return 1 + 6 * layers + stage; }
  int changed(int active_pp) const { return memory(active_pp); }
  // The dynamic-model schemes' counters (PipelineStage::FillDynamismReport).
  int dynamism(int active_pp) const { return changed(active_pp) + 1; }
};

}  // namespace

IterationReporter::IterationReporter(const TrainerConfig& config, torch::Device device,
                                     int64_t memory_capacity_bytes, int device_sharing)
    : config_(config),
      device_(device),
      memory_capacity_(memory_capacity_bytes),
      device_sharing_(device_sharing),
      num_layers_(config.model.num_pipeline_layers()) {}

absl::Status IterationReporter::Gather(int64_t iter, PipelineStage& stage,
                                       const StageIterationStats& stats,
                                       bool model_changed, int active_pp,
                                       Transport& transport, agent::Agent* agent,
                                       double probe_s, double iteration_s,
                                       absl::Span<const std::unique_ptr<PlanSource>> sources) {
  std::vector<int> local_ids;
  for (int i = 0; i < stage.num_local_layers(); ++i) {
    local_ids.push_back(stage.first_layer() + i);
  }
  if (model_changed || local_ids != nonzero_ids_) {
    nonzero_ids_ = local_ids;
    nonzero_params_.clear();
    for (const OwnedLayer& owned : stage.layers()) {
      nonzero_params_.push_back(LayerNonZeroParameters(owned));
    }
  }
  const Slots at{num_layers_};
  const int my_stage = transport.rank() / config_.dp;
  active_pp_ = active_pp;
  const int dynamism_slots = stage.DynamismReportSlots();
  int agreement_slots = 0;
  for (const std::unique_ptr<PlanSource>& source : sources) {
    agreement_slots += source->AgreementSlots();
  }
  const int agreement = at.dynamism(active_pp) + dynamism_slots;
  summary_ = torch::zeros({agreement + agreement_slots}, torch::kDouble);
  auto values = summary_.accessor<double, 1>();
  stage.FillDynamismReport(
      absl::MakeSpan(summary_.data_ptr<double>() + at.dynamism(active_pp), dynamism_slots));
  int offset = agreement;
  for (const std::unique_ptr<PlanSource>& source : sources) {
    const int n = source->AgreementSlots();
    source->OfferAgreement(iter + 1, absl::MakeSpan(summary_.data_ptr<double>() + offset, n));
    offset += n;
  }
  if (my_stage == active_pp - 1) values[0] = stats.loss_sum / config_.microbatches;
  int64_t memory_used = stats.peak_stash_bytes;  // stage_memory.h
  std::vector<int64_t> resident(local_ids.size(), 0);
  // Each layer's backward split at its measured input-gradient share.
  std::vector<double> weight_grad_s(local_ids.size(), 0.0);
  for (size_t i = 0; i < local_ids.size(); ++i) {
    const int l = local_ids[i];
    resident[i] = LayerResidentBytes(stage.layers()[i]);
    weight_grad_s[i] = stats.backward_s[i] * (1 - stats.input_grad_share[i]);
    values[at.forward(l)] = stats.forward_s[i];
    values[at.backward(l)] = stats.backward_s[i];
    values[at.resident(l)] = static_cast<double>(resident[i]);
    values[at.weight_grad(l)] = weight_grad_s[i];
    values[at.activation(l)] = static_cast<double>(stats.activation_bytes[i]);
    values[at.params(l)] = static_cast<double>(nonzero_params_[i]);
    memory_used += resident[i];
  }
  // On a GPU the device knows the truth (device_share.h): the iteration's
  // peak reserved by the caching allocator (every activation autograd saved
  // and the cache it keeps) plus this rank's share of the context and NCCL.
  if (device_.is_cuda()) {
    memory_used = ReadRankMemory(device_, device_sharing_).used_bytes;
    ResetPeakDeviceMemory(device_);
  }
  values[at.memory(my_stage)] = static_cast<double>(memory_used);
  values[at.changed(active_pp)] = model_changed ? 1.0 : 0.0;
  if (agent != nullptr) {
    // Per micro-batch, as the coordinator's cost model expects.
    agent::IterationSample sample;
    sample.iteration = iter;
    const double m = config_.microbatches;
    for (size_t i = 0; i < local_ids.size(); ++i) {
      core::LayerCost c;
      c.id = local_ids[i];
      c.fwd_s = stats.forward_s[i] / m;
      c.bwd_s = (stats.backward_s[i] - weight_grad_s[i]) / m;
      c.wgrad_s = weight_grad_s[i] / m;
      c.params = nonzero_params_[i];
      c.resident_bytes = resident[i];
      c.activation_bytes = stats.activation_bytes[i];
      sample.layers.push_back(c);
    }
    sample.model_changed = model_changed;
    sample.probe_s = probe_s;
    sample.exchange_s = stats.exchange_s;
    sample.iteration_s = iteration_s;
    sample.memory_used_bytes = memory_used;
    sample.memory_capacity_bytes = memory_capacity_;
    // Never blocks; a rejected sample only costs the coordinator data.
    (void)agent->ReportIteration(sample);
  }
  // host-sync(steady): once per iteration: the summary (loss, per-layer times and bytes,
  //   memory, the dynamic-model schemes' counters, the plan agreement for the next
  //   boundary) summed over the world for the log, the coordinator and the plan sources (a
  //   CPU tensor, which NCCL stages through the device and copies back); cost: DynMo
  //   embedded measured 0.999x of no coordinator (one H200, one rank, so without the wire:
  //   docs/benchmarks.md).
  if (absl::Status s = transport.AllReduceSumWorld(summary_); !s.ok()) return s;
  stage.DynamismReportSummed(
      iter, absl::MakeConstSpan(summary_.data_ptr<double>() + at.dynamism(active_pp),
                                dynamism_slots));
  offset = agreement;
  for (const std::unique_ptr<PlanSource>& source : sources) {
    const int n = source->AgreementSlots();
    source->TakeAgreement(iter + 1,
                          absl::MakeConstSpan(summary_.data_ptr<double>() + offset, n));
    offset += n;
  }
  return absl::OkStatus();
}

IterationRecord IterationReporter::Record(int64_t iter, double seconds,
                                          const core::Boundaries& boundaries,
                                          int64_t epoch, int active_ranks) {
  summary_.div_(config_.dp);
  auto values = summary_.accessor<double, 1>();
  const Slots at{num_layers_};
  IterationRecord record;
  record.iter = iter;
  record.loss = values[0];
  record.iteration_s = seconds;
  record.tokens_per_s = static_cast<double>(config_.dp) * config_.microbatches *
                        config_.micro_batch * config_.model.seq_len / seconds;
  for (int l = 0; l < num_layers_; ++l) {
    record.layer_forward_s.push_back(values[at.forward(l)]);
    record.layer_backward_s.push_back(values[at.backward(l)]);
    record.layer_memory_bytes.push_back(static_cast<int64_t>(values[at.resident(l)]));
    record.layer_weight_grad_s.push_back(values[at.weight_grad(l)]);
    record.layer_activation_bytes.push_back(std::llround(values[at.activation(l)]));
    record.layer_params.push_back(std::llround(values[at.params(l)]));
  }
  record.boundaries = boundaries;
  record.stage_times_s =
      StageTimes(record.boundaries, record.layer_forward_s, record.layer_backward_s);
  record.epoch = epoch;
  record.active_ranks = active_ranks;
  record.microbatches = config_.microbatches;
  for (int st = 0; st < active_pp_; ++st) {
    record.stage_memory_bytes.push_back(static_cast<int64_t>(values[at.memory(st)]));
  }
  record.memory_capacity_bytes = memory_capacity_;
  record.model_changed = values[at.changed(active_pp_)] > 0;
  return record;
}

}  // namespace dynmo::trainer
