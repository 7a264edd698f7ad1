#include "formats/plan_formats.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "formats/megatron_layout.h"

namespace dynmo::formats {
namespace {

using nlohmann::json;

absl::Status Bad(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

constexpr int kMaxLayers = kMaxSplitLayers;

constexpr char kEmbeddingFqn[] = "tok_embeddings";
constexpr char kNormFqn[] = "norm";
constexpr char kOutputFqn[] = "output";
constexpr char kBlockPrefix[] = "layers.";

// torchtitan and Megatron name the first layer the embedding and the last the
// head, so both must exist.
absl::Status NeedEmbeddingAndHead(absl::string_view format, int num_layers) {
  if (num_layers >= 2) return absl::OkStatus();
  return Bad(absl::StrCat(format, " names an embedding and a head, so it needs "
                                  "at least 2 layers; the model has ",
                          num_layers));
}

absl::Status CheckBoundaries(absl::Span<const int> b) {
  if (b.size() < 2) {
    return Bad(absl::StrCat("boundaries [", absl::StrJoin(b, ","),
                            "] need at least 2 entries (one stage)"));
  }
  return core::ValidateBoundaries(b, b.back(), static_cast<int>(b.size()) - 1);
}

// ---- DeepSpeed parts and plain boundaries ---------------------------------

absl::StatusOr<core::Boundaries> ReadParts(const json& value, SplitShape shape,
                                           absl::string_view key) {
  const std::string prefix = key == "boundaries" ? "" : absl::StrCat(key, ": ");
  if (!value.is_array()) {
    return Bad(absl::StrCat(prefix, "boundaries must be an array of integers"));
  }
  core::Boundaries b;
  for (const json& v : value) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > kMaxLayers) {
      return Bad(absl::StrCat(prefix, "boundaries must be integers in 0..",
                              kMaxLayers, ", got ", v.dump()));
    }
    b.push_back(static_cast<int>(v.get<int64_t>()));
  }
  absl::Status st = CheckBoundaries(b);
  if (st.ok() && (shape.num_layers >= 0 || shape.num_stages >= 0)) {
    st = core::ValidateBoundaries(
        b, shape.num_layers >= 0 ? shape.num_layers : b.back(),
        shape.num_stages >= 0 ? shape.num_stages : static_cast<int>(b.size()) - 1);
  }
  if (!st.ok()) return Bad(absl::StrCat(prefix, st.message()));
  return b;
}

// ---- torchtitan: module_fqns_per_model_part -------------------------------

json WriteTorchtitan(absl::Span<const int> b) {
  const int num_layers = b.back();
  json parts = json::array();
  for (size_t s = 0; s + 1 < b.size(); ++s) {
    json part = json::array();
    for (int layer = b[s]; layer < b[s + 1]; ++layer) {
      if (layer == 0) {
        part.push_back(kEmbeddingFqn);
      } else if (layer == num_layers - 1) {
        part.push_back(kNormFqn);
        part.push_back(kOutputFqn);
      } else {
        part.push_back(absl::StrCat(kBlockPrefix, layer - 1));
      }
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

std::string TorchtitanName(int layer, int num_layers) {
  if (layer == 0) return kEmbeddingFqn;
  if (layer == num_layers - 1) return "norm/output";
  return absl::StrCat(kBlockPrefix, layer - 1);
}

// One FQN of a model part, as a DynMo layer (the head's id is known only
// once the number of blocks is).
struct NamedModule {
  int part;
  std::string fqn;
  int layer;  // 0 embedding, k+1 for layers.k, kHead for norm and output
};
constexpr int kHead = -1;

absl::StatusOr<int> TorchtitanLayer(const std::string& fqn, int part) {
  if (fqn == kEmbeddingFqn) return 0;
  if (fqn == kNormFqn || fqn == kOutputFqn) return kHead;
  if (absl::StartsWith(fqn, kBlockPrefix)) {
    absl::string_view index = absl::string_view(fqn).substr(sizeof(kBlockPrefix) - 1);
    int k = 0;
    if (!index.empty() && index.size() <= 7 &&
        std::all_of(index.begin(), index.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
        absl::SimpleAtoi(index, &k) && k < kMaxLayers) {
      return k + 1;
    }
  }
  return Bad(absl::StrCat("torchtitan: unknown module '", absl::CHexEscape(fqn),
                          "' in model part ",
                          part, " (tok_embeddings, layers.<k>, norm, output)"));
}

absl::Status Twice(const std::string& fqn, int first, int second) {
  if (first == second) {
    return Bad(absl::StrCat("torchtitan: '", fqn, "' appears twice in model part ",
                            first));
  }
  return Bad(absl::StrCat("torchtitan: '", fqn, "' is in model parts ", first,
                          " and ", second));
}

absl::StatusOr<core::Boundaries> ReadTorchtitan(const json& value, SplitShape shape) {
  if (!value.is_array() || value.empty()) {
    return Bad("torchtitan: module_fqns_per_model_part must be a non-empty list "
               "of model parts, each a list of module FQNs");
  }
  const int num_parts = static_cast<int>(value.size());
  if (shape.num_stages >= 0 && num_parts != shape.num_stages) {
    return Bad(absl::StrCat("torchtitan: ", num_parts, " model parts; the model has ",
                            shape.num_stages, " stages"));
  }
  std::vector<NamedModule> named;
  int max_block = -1;
  for (int p = 0; p < num_parts; ++p) {
    const json& part = value[p];
    if (!part.is_array()) {
      return Bad(absl::StrCat("torchtitan: model part ", p,
                              " must be a list of module FQNs"));
    }
    if (part.empty()) {
      return Bad(absl::StrCat("torchtitan: model part ", p,
                              " is empty; every stage holds at least one layer"));
    }
    for (const json& f : part) {
      if (!f.is_string()) {
        return Bad(absl::StrCat("torchtitan: model part ", p, " holds ", f.dump(),
                                ", not a module FQN"));
      }
      absl::StatusOr<int> layer = TorchtitanLayer(f.get<std::string>(), p);
      if (!layer.ok()) return layer.status();
      max_block = std::max(max_block, *layer - 1);
      named.push_back({p, f.get<std::string>(), *layer});
    }
  }
  int num_layers = max_block + 3;  // embedding + blocks 0..max_block + head
  if (shape.num_layers >= 0) {
    if (absl::Status st = NeedEmbeddingAndHead("torchtitan", shape.num_layers); !st.ok()) {
      return st;
    }
    if (max_block >= shape.num_layers - 2) {
      const int blocks = shape.num_layers - 2;
      return Bad(absl::StrCat(
          "torchtitan: '", kBlockPrefix, max_block, "' is beyond the model's ",
          blocks, " blocks", blocks > 0 ? absl::StrCat(" (layers.0..layers.", blocks - 1, ")") : ""));
    }
    num_layers = shape.num_layers;
  }
  const int head = num_layers - 1;
  std::vector<int> owner(num_layers, -1);
  int norm_part = -1, output_part = -1;
  for (const NamedModule& m : named) {
    int& slot = m.layer != kHead ? owner[m.layer]
                : m.fqn == kNormFqn ? norm_part
                                    : output_part;
    if (slot >= 0) return Twice(m.fqn, slot, m.part);
    slot = m.part;
  }
  for (int layer = 0; layer < head; ++layer) {
    if (owner[layer] < 0) {
      return Bad(absl::StrCat("torchtitan: '", TorchtitanName(layer, num_layers),
                              "' is in no model part"));
    }
  }
  for (const auto& [fqn, part] : {std::pair{kNormFqn, norm_part},
                                  std::pair{kOutputFqn, output_part}}) {
    if (part < 0) {
      return Bad(absl::StrCat("torchtitan: '", fqn, "' is in no model part"));
    }
  }
  if (norm_part != output_part) {
    return Bad(absl::StrCat("torchtitan: 'norm' (model part ", norm_part,
                            ") and 'output' (model part ", output_part,
                            ") must share a model part: together they are the last layer"));
  }
  owner[head] = norm_part;
  // Each part must hold one run of layers, and the runs follow model order.
  std::vector<int> lo(num_parts, num_layers), hi(num_parts, -1), count(num_parts, 0);
  for (int layer = 0; layer < num_layers; ++layer) {
    const int p = owner[layer];
    lo[p] = std::min(lo[p], layer);
    hi[p] = std::max(hi[p], layer);
    ++count[p];
  }
  for (int p = 0; p < num_parts; ++p) {
    if (hi[p] - lo[p] + 1 != count[p]) {
      int gap = lo[p];
      while (owner[gap] == p) ++gap;
      return Bad(absl::StrCat("torchtitan: model part ", p, " is not contiguous: it holds '",
                              TorchtitanName(lo[p], num_layers), "' and '",
                              TorchtitanName(hi[p], num_layers), "' but not '",
                              TorchtitanName(gap, num_layers), "'"));
    }
  }
  core::Boundaries b;
  for (int p = 0; p < num_parts; ++p) {
    if (p > 0 && lo[p] != hi[p - 1] + 1) {
      return Bad(absl::StrCat("torchtitan: model part ", p, " starts at '",
                              TorchtitanName(lo[p], num_layers), "' but model part ",
                              p - 1, " ends at '", TorchtitanName(hi[p - 1], num_layers),
                              "'; parts must follow the model's layer order"));
    }
    b.push_back(lo[p]);
  }
  b.push_back(num_layers);
  return b;
}
// ---- Megatron: --pipeline-model-parallel-layout (megatron_layout.h) -----

absl::StatusOr<core::Boundaries> ReadMegatron(const json& value, SplitShape shape) {
  if (!value.is_string()) {
    return Bad("pipeline_model_parallel_layout must be a string such as \"Et*2|t*2,L\"");
  }
  return ReadMegatronLayout(value.get<std::string>(), shape.num_layers, shape.num_stages);
}

}  // namespace

absl::StatusOr<PlanFormat> ParsePlanFormat(absl::string_view name) {
  for (PlanFormat f : {PlanFormat::kBoundaries, PlanFormat::kTorchtitan,
                       PlanFormat::kMegatron, PlanFormat::kDeepSpeed}) {
    if (name == PlanFormatName(f)) return f;
  }
  return Bad(absl::StrCat("unknown plan format '", name,
                          "' (boundaries, torchtitan, megatron, deepspeed)"));
}

absl::string_view PlanFormatName(PlanFormat format) {
  switch (format) {
    case PlanFormat::kBoundaries: return "boundaries";
    case PlanFormat::kTorchtitan: return "torchtitan";
    case PlanFormat::kMegatron: return "megatron";
    case PlanFormat::kDeepSpeed: return "deepspeed";
  }
  return "boundaries";
}

absl::string_view PlanFormatKey(PlanFormat format) {
  switch (format) {
    case PlanFormat::kBoundaries: return "boundaries";
    case PlanFormat::kTorchtitan: return "module_fqns_per_model_part";
    case PlanFormat::kMegatron: return "pipeline_model_parallel_layout";
    case PlanFormat::kDeepSpeed: return "parts";
  }
  return "boundaries";
}

absl::StatusOr<json> WriteSplit(PlanFormat format, absl::Span<const int> b) {
  if (absl::Status st = CheckBoundaries(b); !st.ok()) return st;
  switch (format) {
    case PlanFormat::kBoundaries:
    case PlanFormat::kDeepSpeed:
      return json(std::vector<int>(b.begin(), b.end()));
    case PlanFormat::kTorchtitan:
      if (absl::Status st = NeedEmbeddingAndHead("torchtitan", b.back()); !st.ok()) return st;
      return WriteTorchtitan(b);
    case PlanFormat::kMegatron:
      if (absl::Status st = NeedEmbeddingAndHead("Megatron", b.back()); !st.ok()) return st;
      return json(WriteMegatronLayout(b));
  }
  return Bad("unknown plan format");
}

absl::StatusOr<core::Boundaries> ReadSplit(PlanFormat format, const json& value,
                                           SplitShape shape) {
  switch (format) {
    case PlanFormat::kBoundaries:
    case PlanFormat::kDeepSpeed:
      return ReadParts(value, shape, PlanFormatKey(format));
    case PlanFormat::kTorchtitan:
      return ReadTorchtitan(value, shape);
    case PlanFormat::kMegatron:
      return ReadMegatron(value, shape);
  }
  return Bad("unknown plan format");
}

absl::StatusOr<core::Boundaries> ReadAnySplit(const json& value, SplitShape shape) {
  if (value.is_string()) return ReadMegatron(value, shape);
  if (value.is_array() && !value.empty() && value[0].is_array()) {
    return ReadTorchtitan(value, shape);
  }
  if (value.is_array()) return ReadParts(value, shape, "boundaries");
  if (value.is_object()) {
    std::vector<PlanFormat> named;
    for (PlanFormat f : {PlanFormat::kBoundaries, PlanFormat::kTorchtitan,
                         PlanFormat::kMegatron, PlanFormat::kDeepSpeed}) {
      if (value.contains(std::string(PlanFormatKey(f)))) named.push_back(f);
    }
    if (named.size() == 1 && value.size() == 1) {
      return ReadSplit(named[0], value.at(std::string(PlanFormatKey(named[0]))), shape);
    }
  }
  return Bad("a split is boundaries [0,...,L], a torchtitan list of FQN lists, a "
             "Megatron layout string, or an object with one key: boundaries, "
             "module_fqns_per_model_part, pipeline_model_parallel_layout or parts");
}

absl::StatusOr<core::Boundaries> ReadSplitText(absl::string_view text, SplitShape shape) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return Bad("the split is empty");
  if (text.front() == '[' || text.front() == '{' || text.front() == '"') {
    json value = json::parse(text.begin(), text.end(), nullptr,
                             /*allow_exceptions=*/false);
    if (value.is_discarded()) return Bad("the split starts like JSON but is not valid JSON");
    return ReadAnySplit(value, shape);
  }
  if (std::all_of(text.begin(), text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) || c == ',' || c == ' ';
      })) {
    json b = json::array();
    for (absl::string_view item : absl::StrSplit(text, ',')) {
      int v = 0;
      if (!absl::SimpleAtoi(item, &v)) {
        return Bad(absl::StrCat("boundaries \"", text, "\" must be integers separated by commas"));
      }
      b.push_back(v);
    }
    return ReadParts(b, shape, "boundaries");
  }
  return ReadMegatron(json(std::string(text)), shape);
}

}  // namespace dynmo::formats
