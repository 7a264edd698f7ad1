#include "trainer/state/layer_state.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "storage/durable_file.h"
#include "trainer/comm/device.h"
#include "trainer/model/adamw_state_select.h"
#include "trainer/model/make_layer.h"

namespace dynmo::trainer {
namespace {

constexpr char kMagic[8] = {'D', 'Y', 'N', 'M', 'O', 'L', 'S', '1'};

// The dtypes a layer may hold, by the name the header uses.
const std::vector<std::pair<std::string, torch::ScalarType>>& DTypes() {
  static const auto* types = new std::vector<std::pair<std::string, torch::ScalarType>>{
      {"float32", torch::kFloat},   {"float64", torch::kDouble},
      {"float16", torch::kHalf},    {"bfloat16", torch::kBFloat16},
      {"int64", torch::kLong},      {"int32", torch::kInt},
      {"int16", torch::kShort},     {"int8", torch::kChar},
      {"uint8", torch::kByte},      {"bool", torch::kBool}};
  return *types;
}

std::string DTypeName(torch::ScalarType t) {
  for (const auto& [name, type] : DTypes()) {
    if (type == t) return name;
  }
  return std::string("unsupported:") + c10::toString(t);
}

torch::Tensor Contiguous(const torch::Tensor& t) { return t.detach().contiguous(); }

int64_t Bytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
}

absl::Status DataLoss(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("layer state: ", what));
}

// The tensors of an encoding in payload order, with their header entry.
struct Entry {
  std::string name;
  std::string role;
  const torch::Tensor* value;
};

std::vector<Entry> EntriesOf(const LayerState& s) {
  std::vector<Entry> out;
  for (const NamedTensor& t : s.parameters) out.push_back({t.name, "param", &t.value});
  for (const NamedTensor& t : s.buffers) out.push_back({t.name, "buffer", &t.value});
  for (const AdamWTensors& a : s.optimizer) {
    out.push_back({a.param, "exp_avg", &a.exp_avg});
    out.push_back({a.param, "exp_avg_sq", &a.exp_avg_sq});
    if (a.max_exp_avg_sq.defined()) {
      out.push_back({a.param, "max_exp_avg_sq", &a.max_exp_avg_sq});
    }
  }
  return out;
}

}  // namespace

OwnedLayer MakeOwnedLayer(const TrainerConfig& config, int id) {
  OwnedLayer owned;
  owned.layer = MakeLayer(config.model, id, config.seed);
  // Initialised on the CPU (the same values on every device), then moved
  // before the optimizer sees its parameters.
  owned.layer->to(DeviceOf(config));
  owned.optimizer = std::make_unique<torch::optim::AdamW>(
      owned.layer->parameters(),
      torch::optim::AdamWOptions(config.lr).weight_decay(config.weight_decay));
  return owned;
}

int64_t LayerState::PayloadBytes() const {
  int64_t n = 0;
  for (const Entry& e : EntriesOf(*this)) n += Bytes(*e.value);
  return n;
}

LayerState CaptureLayerState(const OwnedLayer& owned) {
  LayerState s;
  s.id = owned.layer->id();
  if (const auto* hook = dynamic_cast<const LayerMetadataHook*>(owned.layer.get())) {
    s.metadata = hook->SaveMetadata();
  }
  const auto& state = owned.optimizer->state();
  for (const auto& item : owned.layer->named_parameters()) {
    s.parameters.push_back({item.key(), Contiguous(item.value())});
    auto it = state.find(OptimizerStateKey(item.value()));
    if (it == state.end()) continue;
    const auto& p = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    AdamWTensors a;
    a.param = item.key();
    a.step = p.step();
    a.exp_avg = Contiguous(p.exp_avg());
    a.exp_avg_sq = Contiguous(p.exp_avg_sq());
    if (p.max_exp_avg_sq().defined()) a.max_exp_avg_sq = Contiguous(p.max_exp_avg_sq());
    s.optimizer.push_back(std::move(a));
  }
  for (const auto& item : owned.layer->named_buffers()) {
    s.buffers.push_back({item.key(), Contiguous(item.value())});
  }
  return s;
}

absl::StatusOr<OwnedLayer> RestoreLayer(const TrainerConfig& config,
                                        const LayerState& state) {
  return RestoreLayerInto(MakeOwnedLayer(config, state.id), state);
}

absl::StatusOr<OwnedLayer> RestoreLayerInto(OwnedLayer owned, const LayerState& state) {
  if (owned.layer->id() != state.id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state of layer ", state.id, " restored into layer ", owned.layer->id()));
  }
  auto* hook = dynamic_cast<LayerMetadataHook*>(owned.layer.get());
  if (hook != nullptr) {
    if (absl::Status s = hook->RestoreMetadata(state.metadata); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", state.id, ": metadata rejected: ", s.message()));
    }
  } else if (!state.metadata.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", state.id, " carries ", state.metadata.size(),
        " metadata values but this layer takes none"));
  }
  // A pruned matrix in our CPU CSR form (int32 "row_ptr" / "col_idx",
  // prunable_linear.h) restored onto a GPU takes LibTorch's sparse CSR form
  // there (the same arrays as int64: cuSPARSE), never our CPU kernels on
  // device pointers.
  auto ForDevice = [](const std::string& name, const torch::Tensor& t,
                      torch::Device device) {
    const bool cpu_csr_index =
        t.scalar_type() == torch::kInt &&
        (absl::EndsWith(name, "row_ptr") || absl::EndsWith(name, "col_idx"));
    return device.is_cuda() && cpu_csr_index ? t.to(device, torch::kLong) : t.to(device);
  };
  // Replaces every tensor of `fresh` by the state's tensor of the same name.
  auto replace = [&](const char* what,
                     const torch::OrderedDict<std::string, torch::Tensor>& fresh,
                     const std::vector<NamedTensor>& saved) -> absl::Status {
    std::map<std::string, const torch::Tensor*> by_name;
    for (const NamedTensor& t : saved) by_name[t.name] = &t.value;
    for (const auto& item : fresh) {
      auto it = by_name.find(item.key());
      if (it == by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", state.id, ": the state has no ", what, " '", item.key(), "'"));
      }
      torch::Tensor target = item.value();
      torch::NoGradGuard no_grad;
      // The layer's device wins: a state read from a file (cpu) or received
      // from a peer lands where this layer computes.
      target.set_data(ForDevice(item.key(), *it->second, target.device()));
      by_name.erase(it);
    }
    if (!by_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", state.id, " has no ", what, " '", by_name.begin()->first,
          "' that the state carries"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = replace("parameter", owned.layer->named_parameters(), state.parameters);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = replace("buffer", owned.layer->named_buffers(), state.buffers);
      !s.ok()) {
    return s;
  }
  auto params = owned.layer->named_parameters();
  auto& opt_state = owned.optimizer->state();
  for (const AdamWTensors& a : state.optimizer) {
    const torch::Tensor* p = params.find(a.param);
    if (p == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", state.id, ": optimizer state for unknown parameter '", a.param, "'"));
    }
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(a.step);
    s->exp_avg(a.exp_avg.to(p->device()));
    s->exp_avg_sq(a.exp_avg_sq.to(p->device()));
    if (a.max_exp_avg_sq.defined()) s->max_exp_avg_sq(a.max_exp_avg_sq.to(p->device()));
    opt_state[OptimizerStateKey(*p)] = std::move(s);
  }
  return owned;
}

namespace {

// The JSON header of `state`, describing `entries` in payload order.
nlohmann::json HeaderOf(const LayerState& state, const std::vector<Entry>& entries) {
  nlohmann::json header;
  header["id"] = state.id;
  header["metadata"] = state.metadata;
  header["tensors"] = nlohmann::json::array();
  for (const Entry& e : entries) {
    header["tensors"].push_back({{"name", e.name},
                                 {"role", e.role},
                                 {"dtype", DTypeName(e.value->scalar_type())},
                                 {"shape", e.value->sizes().vec()}});
  }
  header["steps"] = nlohmann::json::object();
  for (const AdamWTensors& a : state.optimizer) header["steps"][a.param] = a.step;
  return header;
}

// One tensor a header announces.
struct TensorSpec {
  std::string name;
  std::string role;
  torch::ScalarType type;
  std::vector<int64_t> shape;
};

struct ParsedHeader {
  int id = -1;
  std::vector<int64_t> metadata;
  std::vector<TensorSpec> tensors;
  nlohmann::json steps;
};

absl::StatusOr<ParsedHeader> ParseHeader(const nlohmann::json& header) {
  if (header.is_discarded() || !header.is_object()) return DataLoss("malformed header");
  ParsedHeader parsed;
  try {
    parsed.id = header.at("id").get<int>();
    parsed.metadata = header.at("metadata").get<std::vector<int64_t>>();
    parsed.steps = header.at("steps");
    for (const nlohmann::json& t : header.at("tensors")) {
      TensorSpec spec;
      spec.name = t.at("name").get<std::string>();
      spec.role = t.at("role").get<std::string>();
      const std::string dtype = t.at("dtype").get<std::string>();
      spec.shape = t.at("shape").get<std::vector<int64_t>>();
      std::optional<torch::ScalarType> type;
      for (const auto& [n, st] : DTypes()) {
        if (n == dtype) type = st;
      }
      if (!type) {
        return DataLoss(absl::StrCat("tensor '", spec.name, "' has unknown dtype ", dtype));
      }
      spec.type = *type;
      for (int64_t d : spec.shape) {
        if (d < 0) {
          return DataLoss(absl::StrCat("tensor '", spec.name, "' has a negative dimension"));
        }
      }
      if (spec.role != "param" && spec.role != "buffer" && spec.role != "exp_avg" &&
          spec.role != "exp_avg_sq" && spec.role != "max_exp_avg_sq") {
        return DataLoss(absl::StrCat("tensor '", spec.name, "' has unknown role ", spec.role));
      }
      parsed.tensors.push_back(std::move(spec));
    }
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(absl::StrCat("malformed header: ", e.what()));
  }
  return parsed;
}

// The state a parsed header describes, holding `values` (one per spec).
absl::StatusOr<LayerState> Assemble(const ParsedHeader& header,
                                    std::vector<torch::Tensor> values) {
  LayerState state;
  state.id = header.id;
  state.metadata = header.metadata;
  std::map<std::string, AdamWTensors> optimizer;
  std::vector<std::string> optimizer_order;
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorSpec& spec = header.tensors[i];
    if (spec.role == "param") {
      state.parameters.push_back({spec.name, std::move(values[i])});
    } else if (spec.role == "buffer") {
      state.buffers.push_back({spec.name, std::move(values[i])});
    } else {
      if (!optimizer.count(spec.name)) optimizer_order.push_back(spec.name);
      AdamWTensors& a = optimizer[spec.name];
      a.param = spec.name;
      (spec.role == "exp_avg"      ? a.exp_avg
       : spec.role == "exp_avg_sq" ? a.exp_avg_sq
                                   : a.max_exp_avg_sq) = std::move(values[i]);
    }
  }
  for (const std::string& name : optimizer_order) {
    AdamWTensors& a = optimizer[name];
    if (!a.exp_avg.defined() || !a.exp_avg_sq.defined()) {
      return DataLoss(absl::StrCat("incomplete optimizer state for '", name, "'"));
    }
    try {
      a.step = header.steps.at(name).get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      return DataLoss(absl::StrCat("malformed header: no step for '", name, "'"));
    }
    state.optimizer.push_back(std::move(a));
  }
  return state;
}

torch::Tensor StringTensor(const std::string& text) {
  torch::Tensor t = torch::empty({static_cast<int64_t>(text.size())}, torch::kByte);
  if (!text.empty()) std::memcpy(t.data_ptr<uint8_t>(), text.data(), text.size());
  return t;
}

}  // namespace

torch::Tensor EncodeLayerState(const LayerState& state) {
  const std::vector<Entry> entries = EntriesOf(state);
  const int64_t payload = state.PayloadBytes();
  const std::string text = HeaderOf(state, entries).dump();
  const uint64_t header_len = text.size();
  const int64_t total = sizeof(kMagic) + sizeof(header_len) +
                        static_cast<int64_t>(header_len) + payload;
  torch::Tensor out = torch::empty({total}, torch::kByte);
  uint8_t* p = out.data_ptr<uint8_t>();
  std::memcpy(p, kMagic, sizeof(kMagic));
  p += sizeof(kMagic);
  std::memcpy(p, &header_len, sizeof(header_len));
  p += sizeof(header_len);
  std::memcpy(p, text.data(), header_len);
  p += header_len;
  for (const Entry& e : entries) {
    // host-sync(event): a checkpoint or a re-shape's checksum: the layer's tensors into one
    //   byte blob on the host
    const torch::Tensor t = e.value->to(torch::kCPU).contiguous();
    const int64_t n = Bytes(t);
    if (n > 0) std::memcpy(p, t.data_ptr(), n);
    p += n;
  }
  return out;
}

absl::StatusOr<LayerState> DecodeLayerState(absl::Span<const uint8_t> bytes) {
  uint64_t header_len = 0;
  if (bytes.size() < sizeof(kMagic) + sizeof(header_len) ||
      std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return DataLoss("not a DynMo layer state (bad magic)");
  }
  std::memcpy(&header_len, bytes.data() + sizeof(kMagic), sizeof(header_len));
  size_t offset = sizeof(kMagic) + sizeof(header_len);
  if (header_len > bytes.size() - offset) return DataLoss("truncated header");
  absl::StatusOr<ParsedHeader> header = ParseHeader(nlohmann::json::parse(
      bytes.begin() + offset, bytes.begin() + offset + header_len, nullptr,
      /*allow_exceptions=*/false));
  if (!header.ok()) return header.status();
  offset += header_len;
  std::vector<torch::Tensor> values;
  for (const TensorSpec& spec : header->tensors) {
    torch::Tensor value = torch::empty(spec.shape, spec.type);
    const int64_t n = Bytes(value);
    if (static_cast<uint64_t>(n) > bytes.size() - offset) {
      return DataLoss(absl::StrCat("payload truncated at tensor '", spec.name, "'"));
    }
    if (n > 0) std::memcpy(value.data_ptr(), bytes.data() + offset, n);
    offset += n;
    values.push_back(std::move(value));
  }
  if (offset != bytes.size()) {
    return DataLoss(absl::StrCat(bytes.size() - offset, " trailing bytes"));
  }
  return Assemble(*header, std::move(values));
}

absl::Status SendLayerState(Transport& transport, const LayerState& state, int peer) {
  const std::vector<Entry> entries = EntriesOf(state);
  torch::Tensor header = StringTensor(HeaderOf(state, entries).dump());
  torch::Tensor size = torch::full({1}, header.numel(), torch::kLong);
  if (absl::Status s = transport.Exchange({P2POp{P2POp::Kind::kSend, &size, peer}});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = transport.Exchange({P2POp{P2POp::Kind::kSend, &header, peer}});
      !s.ok()) {
    return s;
  }
  // Each tensor goes as it is, from where it lives: no staging copy.
  std::vector<torch::Tensor> values;
  for (const Entry& e : entries) {
    if (Bytes(*e.value) > 0) values.push_back(e.value->contiguous());
  }
  std::vector<P2POp> ops;
  for (torch::Tensor& t : values) ops.push_back(P2POp{P2POp::Kind::kSend, &t, peer});
  return ops.empty() ? absl::OkStatus() : transport.Exchange(ops);
}

absl::StatusOr<LayerState> RecvLayerState(Transport& transport, int id, int peer,
                                          torch::Device device) {
  torch::Tensor size = torch::zeros({1}, torch::kLong);
  if (absl::Status s = transport.Exchange({P2POp{P2POp::Kind::kRecv, &size, peer}});
      !s.ok()) {
    return s;
  }
  // host-sync(event): a layer migration: the size of the state that follows
  const int64_t n = size.item<int64_t>();
  if (n <= 0 || n > (int64_t{1} << 30)) {
    return DataLoss(absl::StrCat("rank ", peer, " announced a ", n, "-byte header"));
  }
  torch::Tensor text = torch::empty({n}, torch::kByte);
  if (absl::Status s = transport.Exchange({P2POp{P2POp::Kind::kRecv, &text, peer}});
      !s.ok()) {
    return s;
  }
  const uint8_t* p = text.data_ptr<uint8_t>();
  absl::StatusOr<ParsedHeader> header = ParseHeader(
      nlohmann::json::parse(p, p + n, nullptr, /*allow_exceptions=*/false));
  if (!header.ok()) return header.status();
  // Received straight into tensors on this rank's device.
  std::vector<torch::Tensor> values;
  std::vector<P2POp> ops;
  for (const TensorSpec& spec : header->tensors) {
    values.push_back(torch::empty(spec.shape, torch::TensorOptions(spec.type).device(device)));
  }
  for (torch::Tensor& t : values) {
    if (Bytes(t) > 0) ops.push_back(P2POp{P2POp::Kind::kRecv, &t, peer});
  }
  if (!ops.empty()) {
    if (absl::Status s = transport.Exchange(ops); !s.ok()) return s;
  }
  absl::StatusOr<LayerState> state = Assemble(*header, std::move(values));
  if (state.ok() && state->id != id) {
    return absl::InternalError(absl::StrCat("expected layer ", id, " from rank ", peer,
                                            ", got layer ", state->id));
  }
  return state;
}

absl::Status WriteLayerStateFile(const LayerState& state, const std::string& path) {
  torch::Tensor bytes = EncodeLayerState(state);
  // Durable: a crash leaves the old file or the new, never half of one.
  return storage::ReplaceFileDurably(
      path,
      absl::string_view(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                        static_cast<size_t>(bytes.numel())),
      absl::StrCat(path, ".tmp.", getpid()));
}

absl::StatusOr<LayerState> ReadLayerStateFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const std::streamsize n = in.tellg();
  in.seekg(0);
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  if (!in.read(reinterpret_cast<char*>(bytes.data()), n)) {
    return absl::DataLossError(absl::StrCat("cannot read ", path));
  }
  absl::StatusOr<LayerState> state = DecodeLayerState(bytes);
  if (!state.ok()) {
    return absl::Status(state.status().code(),
                        absl::StrCat(path, ": ", state.status().message()));
  }
  return state;
}

}  // namespace dynmo::trainer
