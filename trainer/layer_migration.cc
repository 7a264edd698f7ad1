#include "trainer/layer_migration.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {
namespace {

// The optimizer's key for a parameter's state (libtorch's own convention).
std::string StateKey(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

absl::Status Send(Transport& t, torch::Tensor tensor, int peer) {
  torch::Tensor contiguous = tensor.contiguous();
  return t.Exchange({P2POp{P2POp::Kind::kSend, &contiguous, peer}});
}

absl::Status Recv(Transport& t, torch::Tensor& into, int peer) {
  return t.Exchange({P2POp{P2POp::Kind::kRecv, &into, peer}});
}

}  // namespace

OwnedLayer MakeOwnedLayer(const TrainerConfig& config, int id) {
  OwnedLayer owned;
  owned.layer = MakeLayer(config.model, id, config.seed);
  owned.optimizer = std::make_unique<torch::optim::AdamW>(
      owned.layer->parameters(),
      torch::optim::AdamWOptions(config.lr).weight_decay(config.weight_decay));
  return owned;
}

absl::Status SendLayer(Transport& transport, OwnedLayer& owned, int peer) {
  std::vector<torch::Tensor> params = owned.layer->parameters();
  auto& state = owned.optimizer->state();
  // Header: the layer id, then per parameter its AdamW step, -1 for none.
  torch::Tensor header = torch::empty({1 + static_cast<int64_t>(params.size())}, torch::kLong);
  header[0] = owned.layer->id();
  std::vector<torch::optim::AdamWParamState*> states;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = state.find(StateKey(params[i]));
    auto* s = it == state.end()
                  ? nullptr
                  : static_cast<torch::optim::AdamWParamState*>(it->second.get());
    states.push_back(s);
    header[1 + i] = s == nullptr ? int64_t{-1} : s->step();
  }
  if (absl::Status st = Send(transport, header, peer); !st.ok()) return st;
  for (size_t i = 0; i < params.size(); ++i) {
    if (absl::Status st = Send(transport, params[i].detach(), peer); !st.ok()) return st;
    if (states[i] == nullptr) continue;
    if (absl::Status st = Send(transport, states[i]->exp_avg(), peer); !st.ok()) return st;
    if (absl::Status st = Send(transport, states[i]->exp_avg_sq(), peer); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<OwnedLayer> RecvLayer(Transport& transport,
                                     const TrainerConfig& config, int id,
                                     int peer) {
  OwnedLayer owned = MakeOwnedLayer(config, id);
  std::vector<torch::Tensor> params = owned.layer->parameters();
  torch::Tensor header = torch::empty({1 + static_cast<int64_t>(params.size())}, torch::kLong);
  if (absl::Status st = Recv(transport, header, peer); !st.ok()) return st;
  if (header[0].item<int64_t>() != id) {
    return absl::InternalError(absl::StrCat("expected layer ", id, " from rank ", peer,
                                            ", got layer ", header[0].item<int64_t>()));
  }
  auto& state = owned.optimizer->state();
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor data = params[i].detach();  // shares the parameter's storage
    if (absl::Status st = Recv(transport, data, peer); !st.ok()) return st;
    const int64_t step = header[1 + i].item<int64_t>();
    if (step < 0) continue;
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    torch::Tensor exp_avg = torch::empty_like(data), exp_avg_sq = torch::empty_like(data);
    if (absl::Status st = Recv(transport, exp_avg, peer); !st.ok()) return st;
    if (absl::Status st = Recv(transport, exp_avg_sq, peer); !st.ok()) return st;
    s->step(step);
    s->exp_avg(exp_avg);
    s->exp_avg_sq(exp_avg_sq);
    state[StateKey(params[i])] = std::move(s);
  }
  return owned;
}

}  // namespace dynmo::trainer
