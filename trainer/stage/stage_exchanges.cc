// PipelineStage's point-to-point exchanges with its neighbour stages: the
// activations (and, under early exit, the token masks) sent down the
// pipeline and the gradients sent back, each schedule step's ops posted as
// one batch through the Transport (trainer/comm/transport.h). The rest of
// the stage is pipeline_stage.cc. Same thread-safety as the class.
#include <vector>

#include "trainer/stage/pipeline_stage.h"

namespace dynmo::trainer {

absl::Status PipelineStage::RecvForward(int mb) {
  if (is_first()) return absl::OkStatus();
  InFlight& f = in_flight_[mb];
  f.input = ActivationBuffer();
  std::vector<P2POp> ops = {P2POp{P2POp::Kind::kRecv, &f.input, prev_rank_}};
  if (early_exit_) {
    f.token_mask = MaskBuffer();
    ops.push_back(P2POp{P2POp::Kind::kRecv, &f.token_mask, prev_rank_});
  }
  return transport_->Exchange(ops);
}

absl::Status PipelineStage::SendForward(int mb) {
  if (is_last()) return absl::OkStatus();
  torch::Tensor out = in_flight_[mb].layer_outputs.back().detach().contiguous();
  torch::Tensor mask = early_exit_ ? OutgoingMask(mb) : torch::Tensor();
  std::vector<P2POp> ops = {P2POp{P2POp::Kind::kSend, &out, next_rank_}};
  if (early_exit_) ops.push_back(P2POp{P2POp::Kind::kSend, &mask, next_rank_});
  return transport_->Exchange(ops);
}

absl::Status PipelineStage::SendForwardRecvBackward(int send_mb, int recv_mb) {
  if (is_last()) return absl::OkStatus();
  torch::Tensor out = in_flight_[send_mb].layer_outputs.back().detach().contiguous();
  torch::Tensor mask = early_exit_ ? OutgoingMask(send_mb) : torch::Tensor();
  std::vector<P2POp> ops = {P2POp{P2POp::Kind::kSend, &out, next_rank_}};
  if (early_exit_) ops.push_back(P2POp{P2POp::Kind::kSend, &mask, next_rank_});
  if (OutputCarriesGrad()) {
    in_flight_[recv_mb].output_grad = ActivationBuffer();
    ops.push_back(
        P2POp{P2POp::Kind::kRecv, &in_flight_[recv_mb].output_grad, next_rank_});
  }
  return transport_->Exchange(ops);
}

absl::Status PipelineStage::SendBackward(int mb) {
  if (is_first() || !InputCarriesGrad()) return absl::OkStatus();
  absl::Status s = transport_->Exchange(
      {P2POp{P2POp::Kind::kSend, &in_flight_[mb].input_grad, prev_rank_}});
  in_flight_[mb].input_grad = torch::Tensor();
  return s;
}

absl::Status PipelineStage::SendBackwardRecvForward(int send_mb, int recv_mb) {
  if (is_first()) return absl::OkStatus();
  InFlight& r = in_flight_[recv_mb];
  r.input = ActivationBuffer();
  std::vector<P2POp> ops;
  if (InputCarriesGrad()) {
    ops.push_back(P2POp{P2POp::Kind::kSend, &in_flight_[send_mb].input_grad, prev_rank_});
  }
  ops.push_back(P2POp{P2POp::Kind::kRecv, &r.input, prev_rank_});
  if (early_exit_) {
    r.token_mask = MaskBuffer();
    ops.push_back(P2POp{P2POp::Kind::kRecv, &r.token_mask, prev_rank_});
  }
  absl::Status s = transport_->Exchange(ops);
  in_flight_[send_mb].input_grad = torch::Tensor();
  return s;
}

absl::Status PipelineStage::RecvBackward(int mb) {
  if (is_last() || !OutputCarriesGrad()) return absl::OkStatus();
  in_flight_[mb].output_grad = ActivationBuffer();
  return transport_->Exchange(
      {P2POp{P2POp::Kind::kRecv, &in_flight_[mb].output_grad, next_rank_}});
}

}  // namespace dynmo::trainer
