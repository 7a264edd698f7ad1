#include "trainer/pipeline_stage.h"

#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

torch::Tensor TokensTensor(std::vector<int64_t>& data, int rows, int cols) {
  return torch::from_blob(data.data(), {rows, cols}, torch::kLong).clone();
}

}  // namespace

PipelineStage::PipelineStage(const TrainerConfig& config,
                             const core::Boundaries& b, int stage, int dp_rank,
                             Transport* transport, const TokenCorpus* corpus)
    : config_(config),
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
}

torch::Tensor PipelineStage::ActivationBuffer() const {
  return torch::empty({config_.micro_batch, config_.model.seq_len,
                       config_.model.hidden},
                      torch::kFloat);
}

absl::Status PipelineStage::RunIteration(int64_t iter, StageIterationStats* stats) {
  iter_ = iter;
  stats_ = stats;
  *stats = StageIterationStats{};
  stats->forward_s.assign(layers_.size(), 0.0);
  stats->backward_s.assign(layers_.size(), 0.0);
  in_flight_.assign(config_.microbatches, InFlight{});
  for (OwnedLayer& owned : layers_) owned.optimizer->zero_grad();

  absl::Status s = RunOneFOneB(stage_, num_stages_, config_.microbatches, *this);
  if (!s.ok()) return s;
  if (s = AverageGradientsOverDataParallel(); !s.ok()) return s;
  for (OwnedLayer& owned : layers_) owned.optimizer->step();
  in_flight_.clear();
  return absl::OkStatus();
}

absl::Status PipelineStage::RecvForward(int mb) {
  if (is_first()) return absl::OkStatus();
  in_flight_[mb].input = ActivationBuffer();
  P2POp op{P2POp::Kind::kRecv, &in_flight_[mb].input, prev_rank_};
  return transport_->Exchange({op});
}

absl::Status PipelineStage::Forward(int mb) {
  InFlight& f = in_flight_[mb];
  const SampleLayout layout{config_.model.seq_len, config_.micro_batch,
                            config_.microbatches, config_.dp};
  torch::Tensor x, targets;
  if (is_first() || is_last()) {
    std::vector<int64_t> inputs, target_ids;
    FillMicroBatch(*corpus_, layout, iter_, dp_rank_, mb, &inputs, &target_ids);
    if (is_first()) x = TokensTensor(inputs, config_.micro_batch, config_.model.seq_len);
    if (is_last()) {
      targets = TokensTensor(target_ids, config_.micro_batch, config_.model.seq_len);
    }
  }
  if (!is_first()) x = f.input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    PipelineLayer& layer = *layers_[i].layer;
    // Token ids carry no gradient; hidden states start a fresh graph per layer.
    torch::Tensor in = layer.kind() == LayerKind::kEmbedding
                           ? x
                           : x.detach().requires_grad_(true);
    const auto start = std::chrono::steady_clock::now();
    torch::Tensor out = layer.Forward(in, targets);
    stats_->forward_s[i] += SecondsSince(start);
    f.layer_inputs.push_back(in);
    f.layer_outputs.push_back(out);
    x = out;
  }
  if (is_last()) stats_->loss_sum += x.item<double>();
  return absl::OkStatus();
}

absl::Status PipelineStage::SendForward(int mb) {
  if (is_last()) return absl::OkStatus();
  torch::Tensor out = in_flight_[mb].layer_outputs.back().detach().contiguous();
  return transport_->Exchange({P2POp{P2POp::Kind::kSend, &out, next_rank_}});
}

absl::Status PipelineStage::SendForwardRecvBackward(int send_mb, int recv_mb) {
  if (is_last()) return absl::OkStatus();
  torch::Tensor out = in_flight_[send_mb].layer_outputs.back().detach().contiguous();
  in_flight_[recv_mb].output_grad = ActivationBuffer();
  return transport_->Exchange(
      {P2POp{P2POp::Kind::kSend, &out, next_rank_},
       P2POp{P2POp::Kind::kRecv, &in_flight_[recv_mb].output_grad, next_rank_}});
}

absl::Status PipelineStage::Backward(int mb) {
  InFlight& f = in_flight_[mb];
  torch::Tensor grad =
      is_last() ? torch::full({}, 1.0 / config_.microbatches, torch::kFloat)
                : f.output_grad;
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    const auto start = std::chrono::steady_clock::now();
    torch::autograd::backward({f.layer_outputs[i]}, {grad});
    stats_->backward_s[i] += SecondsSince(start);
    if (layers_[i].layer->kind() != LayerKind::kEmbedding) {
      grad = f.layer_inputs[i].grad();
    }
  }
  if (!is_first()) f.input_grad = grad.contiguous();
  f.layer_inputs.clear();
  f.layer_outputs.clear();
  f.input = torch::Tensor();
  f.output_grad = torch::Tensor();
  return absl::OkStatus();
}

absl::Status PipelineStage::SendBackward(int mb) {
  if (is_first()) return absl::OkStatus();
  absl::Status s = transport_->Exchange(
      {P2POp{P2POp::Kind::kSend, &in_flight_[mb].input_grad, prev_rank_}});
  in_flight_[mb].input_grad = torch::Tensor();
  return s;
}

absl::Status PipelineStage::SendBackwardRecvForward(int send_mb, int recv_mb) {
  if (is_first()) return absl::OkStatus();
  in_flight_[recv_mb].input = ActivationBuffer();
  absl::Status s = transport_->Exchange(
      {P2POp{P2POp::Kind::kSend, &in_flight_[send_mb].input_grad, prev_rank_},
       P2POp{P2POp::Kind::kRecv, &in_flight_[recv_mb].input, prev_rank_}});
  in_flight_[send_mb].input_grad = torch::Tensor();
  return s;
}

absl::Status PipelineStage::RecvBackward(int mb) {
  if (is_last()) return absl::OkStatus();
  in_flight_[mb].output_grad = ActivationBuffer();
  return transport_->Exchange(
      {P2POp{P2POp::Kind::kRecv, &in_flight_[mb].output_grad, next_rank_}});
}

absl::Status PipelineStage::AverageGradientsOverDataParallel() {
  if (config_.dp == 1) return absl::OkStatus();
  std::vector<torch::Tensor> grads;
  for (OwnedLayer& owned : layers_) {
    for (torch::Tensor& p : owned.layer->parameters()) {
      // A parameter the data never reached (an unused embedding row keeps a
      // dense zero gradient, but be safe) still joins the all-reduce.
      if (!p.mutable_grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      grads.push_back(p.grad());
    }
  }
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
      if (absl::Status s = SendLayer(*transport_, it->second, peer); !s.ok()) return s;
      held.erase(it);
    } else if (m.to_stage == stage_) {
      const int peer = RankAt(m.from_stage, dp_rank_, config_.dp);
      absl::StatusOr<OwnedLayer> owned = RecvLayer(*transport_, config_, m.layer, peer);
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
