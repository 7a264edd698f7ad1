#include "trainer/stage/pipeline_stage.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/comm/device.h"
#include "trainer/model/early_exit.h"

namespace dynmo::trainer {
namespace {

// Runs a stage's ops unchanged and reports every Forward / Backward once it
// returns: the stage tracks its peak activation stash there and, without
// per-layer clocks (--profile_layers=false), times whole stage passes.
class ObservedOps : public StageOps {
 public:
  using Observer = std::function<void(bool forward)>;
  ObservedOps(StageOps& inner, LayerClock* pass_clock, double* forward_s,
              double* backward_s, double* exchange_s, Observer observer)
      : inner_(inner),
        clock_(pass_clock),
        forward_s_(forward_s),
        backward_s_(backward_s),
        exchange_s_(exchange_s),
        observer_(std::move(observer)) {}
  absl::Status RecvForward(int mb) override {
    return Exchange([&] { return inner_.RecvForward(mb); });
  }
  absl::Status Forward(int mb) override { return Timed(true, [&] { return inner_.Forward(mb); }); }
  absl::Status SendForward(int mb) override {
    return Exchange([&] { return inner_.SendForward(mb); });
  }
  absl::Status SendForwardRecvBackward(int s, int r) override {
    return Exchange([&] { return inner_.SendForwardRecvBackward(s, r); });
  }
  absl::Status Backward(int mb) override { return Timed(false, [&] { return inner_.Backward(mb); }); }
  absl::Status SendBackward(int mb) override {
    return Exchange([&] { return inner_.SendBackward(mb); });
  }
  absl::Status SendBackwardRecvForward(int s, int r) override {
    return Exchange([&] { return inner_.SendBackwardRecvForward(s, r); });
  }
  absl::Status RecvBackward(int mb) override {
    return Exchange([&] { return inner_.RecvBackward(mb); });
  }

 private:
  // The host's time in an exchange (on a GPU, what the host spent posting
  // it: the transport waits on streams, not on the host).
  template <typename Op>
  absl::Status Exchange(Op op) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = op();
    *exchange_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return s;
  }
  template <typename Op>
  absl::Status Timed(bool forward, Op op) {
    if (clock_ == nullptr) {
      absl::Status s = op();
      observer_(forward);
      return s;
    }
    const LayerClock::Span span = clock_->Start();
    absl::Status s = op();
    clock_->Stop(span, forward ? forward_s_ : backward_s_);
    observer_(forward);
    return s;
  }
  StageOps& inner_;
  LayerClock* clock_;  // null: per-layer clocks run instead
  double* forward_s_;
  double* backward_s_;
  double* exchange_s_;
  Observer observer_;
};

}  // namespace

PipelineStage::PipelineStage(const TrainerConfig& config,
                             const core::Boundaries& b, int stage, int dp_rank,
                             Transport* transport, const TokenCorpus* corpus)
    : config_(config),
      device_(DeviceOf(config)),
      clock_(device_, config.layer_clock == "wall"  ? -1
                      : config.intra_op_threads == 1 ? CLOCK_THREAD_CPUTIME_ID
                                                     : CLOCK_PROCESS_CPUTIME_ID),
      stage_(stage),
      num_stages_(static_cast<int>(b.size()) - 1),
      dp_rank_(dp_rank),
      first_layer_(b[stage]),
      transport_(transport),
      corpus_(corpus) {
  if (!is_first()) prev_rank_ = RankAt(stage - 1, dp_rank, config.dp);
  if (!is_last()) next_rank_ = RankAt(stage + 1, dp_rank, config.dp);
  for (int id = b[stage]; id < b[stage + 1]; ++id) {
    layers_.push_back(MakeOwnedLayer(config, id));
  }
  dynamisms_ = MakeStageDynamisms(config);
  early_exit_ = config.model.dynamism.Has("early-exit");
}

StageView PipelineStage::View() {
  return StageView{config_, stage_,  num_stages_, dp_rank_,
                   layers_, *transport_, &frozen_prefix_};
}

bool PipelineStage::TakeModelChanged() {
  bool changed = false;
  for (auto& d : dynamisms_) changed = d->TakeModelChanged() || changed;
  return changed;
}

int PipelineStage::DynamismReportSlots() const {
  int n = 0;
  for (const auto& d : dynamisms_) n += d->ReportSlots();
  return n;
}

void PipelineStage::FillDynamismReport(absl::Span<double> slots) {
  StageView view = View();
  for (auto& d : dynamisms_) {
    const int n = d->ReportSlots();
    d->FillReport(view, slots.subspan(0, n));
    slots.remove_prefix(n);
  }
}

void PipelineStage::DynamismReportSummed(int64_t iter, absl::Span<const double> slots) {
  for (auto& d : dynamisms_) {
    const int n = d->ReportSlots();
    d->ReportSummed(iter, slots.subspan(0, n), transport_->rank());
    slots.remove_prefix(n);
  }
}

torch::Tensor PipelineStage::MaskBuffer() const {
  return torch::empty({config_.micro_batch, config_.model.seq_len},
                      torch::TensorOptions(torch::kUInt8).device(device_));
}

torch::Tensor PipelineStage::TokensOnDevice(std::vector<int64_t>& data) const {
  // A copy on every device: `data` does not outlive the micro-batch's start.
  const torch::Tensor host =
      torch::from_blob(data.data(), {config_.micro_batch, config_.model.seq_len}, torch::kLong);
  if (!device_.is_cuda()) return host.clone();
  // One pinned staging copy, then an upload the host does not wait for:
  // PyTorch's pinned-memory allocator keeps the staging block until the
  // copy on the current stream has finished.
  return host.pin_memory().to(device_, torch::kLong, /*non_blocking=*/true, /*copy=*/true);
}

torch::Tensor PipelineStage::OutgoingMask(int mb) const {
  return TokenMaskToWire(in_flight_[mb].context.token_active, config_.micro_batch,
                         config_.model.seq_len, device_);
}

torch::Tensor PipelineStage::ActivationBuffer() const {
  return torch::empty({config_.micro_batch, config_.model.seq_len,
                       config_.model.hidden},
                      torch::TensorOptions(torch::kFloat).device(device_));
}

absl::Status PipelineStage::RunIteration(int64_t iter, StageIterationStats* stats) {
  iter_ = iter;
  stats_ = stats;
  *stats = StageIterationStats{};
  stats->forward_s.assign(layers_.size(), 0.0);
  stats->backward_s.assign(layers_.size(), 0.0);
  stats->activation_bytes.assign(layers_.size(), 0);
  PrepareGradientSplit(iter);
  in_flight_.assign(config_.microbatches, InFlight{});
  StageView view = View();
  for (auto& d : dynamisms_) {
    if (absl::Status s = d->BeforeIteration(iter, view); !s.ok()) return s;
  }
  loss_sum_ = torch::zeros({}, torch::TensorOptions(torch::kDouble).device(device_));
  // Stage-pass clocks: used as the layer times without per-layer clocks.
  double forward_pass_s = 0, backward_pass_s = 0;
  ObservedOps observed(*this, config_.profile_layers ? nullptr : &clock_,
                       &forward_pass_s, &backward_pass_s, &stats->exchange_s, [&](bool) {
                         stats->peak_stash_bytes =
                             std::max(stats->peak_stash_bytes, StashedBytes());
                       });
  absl::Status s;
  {
    // From freeing the old gradients to the last backward: every block the
    // meter's reporter saw allocated is also freed under it.
    ActivationMeter::Scope measured(meter_);
    for (OwnedLayer& owned : layers_) owned.optimizer->zero_grad();
    std::optional<TimedOps> timed;
    if (timeline_ != nullptr && timeline_->Covers(iter)) {
      std::function<void()> sync;
      if (device_.is_cuda()) {
        // host-sync(event): only in --perfetto_out's window, so that each slice is the
        //   device's time, not the launch's
        sync = [device = device_] { SynchronizeDevice(device); };
      }
      timed.emplace(observed, *timeline_, stage_, num_stages_, iter, std::move(sync));
    }
    s = RunOneFOneB(stage_, num_stages_, config_.microbatches,
                    timed ? static_cast<StageOps&>(*timed) : observed);
  }
  if (!s.ok()) return s;
  // The all-reduce and the optimizer step are queued before the host reads
  // the device (below), so the device runs them while the host waits.
  if (s = AverageGradientsOverDataParallel(); s.ok()) {
    for (OwnedLayer& owned : layers_) owned.optimizer->step();
  }
  // One read of the device per iteration: every clock and the loss (even
  // when the all-reduce failed: the clocks' slots include this frame's).
  clock_.Collect();
  if (!s.ok()) return s;
  FinishGradientSplit(stats);
  // host-sync(steady): once per iteration, after the step is queued: the loss for the log and
  //   the report (with the one read of the clocks just above); cost: none of its own: the
  //   clocks' read above has already waited.
  if (is_last()) stats->loss_sum = loss_sum_.item<double>();
  if (!config_.profile_layers && !layers_.empty()) {
    // Without per-layer clocks the stage's passes are spread evenly.
    const double n = static_cast<double>(layers_.size());
    stats->forward_s.assign(layers_.size(), forward_pass_s / n);
    stats->backward_s.assign(layers_.size(), backward_pass_s / n);
  }
  in_flight_.clear();
  for (auto& d : dynamisms_) {
    if (s = d->AfterStep(iter, view); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void PipelineStage::PrepareGradientSplit(int64_t iter) {
  std::vector<int> ids;
  for (const OwnedLayer& owned : layers_) ids.push_back(owned.layer->id());
  if (ids != split_ids_) {  // new layers (migration): measure them now
    split_ids_ = ids;
    input_grad_share_.assign(ids.size(), -1.0);
  }
  bool unknown = false;
  for (double share : input_grad_share_) unknown = unknown || share < 0;
  probe_split_ = config_.profile_layers && (unknown || iter % kGradientSplitEvery == 0);
  probe_input_s_.assign(ids.size(), 0.0);
  probe_full_s_.assign(ids.size(), 0.0);
}

void PipelineStage::FinishGradientSplit(StageIterationStats* stats) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (probe_split_) {
      // A layer that ran no backward (frozen) has no weight gradient.
      input_grad_share_[i] =
          probe_full_s_[i] > 0
              ? std::clamp(probe_input_s_[i] / probe_full_s_[i], 0.0, 1.0)
              : 1.0;
    }
    stats->input_grad_share.push_back(input_grad_share_[i] < 0 ? 1.0 : input_grad_share_[i]);
  }
}

absl::Status PipelineStage::Forward(int mb) {
  InFlight& f = in_flight_[mb];
  const SampleLayout layout{config_.model.seq_len, config_.micro_batch,
                            config_.microbatches, config_.dp};
  torch::Tensor x;
  f.context.iteration = iter_;
  f.context.micro_batch = mb;
  {
    // Every stage reads its micro-batch's targets: cheap, and any layer's
    // auxiliary loss (early exit) may need them.
    std::vector<int64_t> inputs, target_ids;
    FillMicroBatch(*corpus_, layout, iter_, dp_rank_, mb, &inputs, &target_ids);
    if (is_first()) x = TokensOnDevice(inputs);
    f.context.targets = TokensOnDevice(target_ids);
  }
  if (!is_first()) x = f.input;
  if (!is_first() && early_exit_) f.context.token_active = TokenMaskFromWire(f.token_mask);
  for (size_t i = 0; i < layers_.size(); ++i) {
    PipelineLayer& layer = *layers_[i].layer;
    // Token ids carry no gradient; hidden states start a fresh graph per
    // layer, needing a gradient only above the frozen prefix.
    torch::Tensor in = layer.kind() == LayerKind::kEmbedding
                           ? x
                           : x.detach().requires_grad_(layer.id() > frozen_prefix_);
    const size_t aux_before = f.context.aux_losses.size();
    const bool clock = config_.profile_layers;
    const LayerClock::Span span = clock ? clock_.Start() : LayerClock::Span{};
    meter_.Begin();
    torch::Tensor out = layer.Forward(in, f.context);
    stats_->activation_bytes[i] = std::max(stats_->activation_bytes[i], meter_.End());
    if (clock) clock_.Stop(span, &stats_->forward_s[i]);
    torch::Tensor aux;
    for (size_t a = aux_before; a < f.context.aux_losses.size(); ++a) {
      aux = aux.defined() ? aux + f.context.aux_losses[a] : f.context.aux_losses[a];
    }
    f.layer_inputs.push_back(in);
    f.layer_outputs.push_back(out);
    f.layer_aux_losses.push_back(aux);
    x = out;
  }
  if (is_last()) loss_sum_ += x.detach();
  return absl::OkStatus();
}

absl::Status PipelineStage::Backward(int mb) {
  InFlight& f = in_flight_[mb];
  // Each micro-batch's losses weigh 1/M: the gradient of the mean.
  const torch::Tensor loss_weight = torch::full(
      {}, 1.0 / config_.microbatches, torch::TensorOptions(torch::kFloat).device(device_));
  torch::Tensor grad = is_last() ? loss_weight : f.output_grad;
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    // Frozen layers (and all before them) run no backward at all.
    if (layers_[i].layer->id() < frozen_prefix_) break;
    const bool clock = config_.profile_layers;
    std::vector<torch::Tensor> outputs = {f.layer_outputs[i]};
    std::vector<torch::Tensor> grads = {grad};
    if (f.layer_aux_losses[i].defined()) {
      outputs.push_back(f.layer_aux_losses[i]);
      grads.push_back(loss_weight);
    }
    const bool probe = clock && probe_split_ && mb == 0;
    const bool probe_input = probe && f.layer_inputs[i].requires_grad();
    const LayerClock::Span full = probe ? clock_.Start() : LayerClock::Span{};
    const LayerClock::Span span = clock ? clock_.Start() : LayerClock::Span{};
    torch::autograd::backward(outputs, grads, /*retain_graph=*/probe_input);
    if (clock) clock_.Stop(span, &stats_->backward_s[i]);
    if (probe) clock_.Stop(full, &probe_full_s_[i]);
    if (probe_input) {
      // The input gradient alone, on the graph the full pass kept (as warm as
      // it); returned, not accumulated: the training arithmetic is untouched.
      const LayerClock::Span input_only = clock_.Start();
      (void)torch::autograd::grad(outputs, {f.layer_inputs[i]}, grads,
                                  /*retain_graph=*/false, /*create_graph=*/false,
                                  /*allow_unused=*/true);
      clock_.Stop(input_only, &probe_input_s_[i]);
    }
    if (layers_[i].layer->kind() != LayerKind::kEmbedding) {
      grad = f.layer_inputs[i].grad();
    }
  }
  if (!is_first() && InputCarriesGrad()) f.input_grad = grad.contiguous();
  f.layer_inputs.clear();
  f.layer_outputs.clear();
  f.layer_aux_losses.clear();
  f.context = MicroBatchContext{};
  f.input = torch::Tensor();
  f.token_mask = torch::Tensor();
  f.output_grad = torch::Tensor();
  return absl::OkStatus();
}

int64_t PipelineStage::StashedBytes() const {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  auto add = [&](const torch::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    const void* storage = t.storage().unsafeGetStorageImpl();
    if (seen.insert(storage).second) bytes += static_cast<int64_t>(t.storage().nbytes());
  };
  for (const InFlight& f : in_flight_) {
    add(f.input);
    add(f.output_grad);
    for (const torch::Tensor& t : f.layer_inputs) add(t);
    for (const torch::Tensor& t : f.layer_outputs) add(t);
  }
  return bytes;
}

absl::Status PipelineStage::AverageGradientsOverDataParallel() {
  if (config_.dp == 1) return absl::OkStatus();
  std::vector<torch::Tensor> grads;
  for (OwnedLayer& owned : layers_) {
    for (torch::Tensor& p : owned.layer->parameters()) {
      // Frozen parameters (freezing.h) drop out of the exchange; every
      // replica agrees on which, from the job-wide frozen prefix.
      if (!p.requires_grad()) continue;
      // A parameter the data never reached (an unused embedding row keeps a
      // dense zero gradient, but be safe) still joins the all-reduce.
      if (!p.mutable_grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
  }
  if (grads.empty()) return absl::OkStatus();  // the whole stage is frozen
  torch::Tensor flat = torch::cat(
      [&] {
        std::vector<torch::Tensor> views;
        for (auto& g : grads) views.push_back(g.reshape({-1}));
        return views;
      }());
  if (absl::Status s = transport_->AllReduceSumDataParallel(flat); !s.ok()) {
    return s;
  }
  flat.div_(config_.dp);
  int64_t offset = 0;
  for (auto& g : grads) {
    const int64_t n = g.numel();
    g.copy_(flat.narrow(0, offset, n).view_as(g));
    offset += n;
  }
  return absl::OkStatus();
}

void PipelineStage::Rebind(int stage, int num_stages, Transport* transport) {
  stage_ = stage;
  num_stages_ = num_stages;
  transport_ = transport;
  prev_rank_ = is_first() ? -1 : RankAt(stage - 1, dp_rank_, config_.dp);
  next_rank_ = is_last() ? -1 : RankAt(stage + 1, dp_rank_, config_.dp);
}

void PipelineStage::Regroup(int stage, int num_stages, int dp, int dp_rank,
                            int microbatches, std::vector<OwnedLayer> layers,
                            Transport* transport) {
  // The stage reads its grid from config_ (ranks of neighbours, the data
  // layout, the gradient mean, the schedule's length): keep it current.
  config_.dp = dp;
  config_.microbatches = microbatches;
  dp_rank_ = dp_rank;
  layers_ = std::move(layers);
  first_layer_ = layers_.empty() ? 0 : layers_.front().layer->id();
  Rebind(stage, num_stages, transport);
}

absl::Status PipelineStage::ApplyMigration(const core::MigrationPlan& plan,
                                           const core::Boundaries& to) {
  std::map<int, OwnedLayer> held;
  for (OwnedLayer& owned : layers_) {
    const int id = owned.layer->id();
    held[id] = std::move(owned);
  }
  layers_.clear();
  for (const core::LayerMigration& m : plan.migrations) {
    if (m.from_stage == stage_) {
      auto it = held.find(m.layer);
      if (it == held.end()) {
        return absl::InternalError(absl::StrCat(
            "stage ", stage_, " is asked to send layer ", m.layer, " it does not hold"));
      }
      const int peer = RankAt(m.to_stage, dp_rank_, config_.dp);
      if (absl::Status s = SendLayerState(*transport_, CaptureLayerState(it->second), peer);
          !s.ok()) {
        return s;
      }
      held.erase(it);
    } else if (m.to_stage == stage_) {
      const int peer = RankAt(m.from_stage, dp_rank_, config_.dp);
      absl::StatusOr<LayerState> state = RecvLayerState(*transport_, m.layer, peer, device_);
      if (!state.ok()) return state.status();
      absl::StatusOr<OwnedLayer> owned = RestoreLayer(config_, *state);
      if (!owned.ok()) return owned.status();
      held[m.layer] = std::move(*owned);
    }
  }
  // std::map iterates in id order: the new contiguous slice.
  for (auto& [id, owned] : held) {
    if (id != to[stage_] + static_cast<int>(layers_.size())) {
      return absl::InternalError(absl::StrCat("after migration stage ", stage_,
                                              " holds layer ", id, " outside its slice [",
                                              to[stage_], ", ", to[stage_ + 1], ")"));
    }
    layers_.push_back(std::move(owned));
  }
  if (static_cast<int>(layers_.size()) != to[stage_ + 1] - to[stage_]) {
    return absl::InternalError(absl::StrCat("after migration stage ", stage_, " holds ",
                                            layers_.size(), " layers, expected ",
                                            to[stage_ + 1] - to[stage_]));
  }
  first_layer_ = to[stage_];
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
