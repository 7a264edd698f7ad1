#include "trainer/config/dynamism_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dynmo::trainer {

bool DynamismConfig::Has(absl::string_view name) const {
  return std::find(cases.begin(), cases.end(), name) != cases.end();
}

bool DynamismConfig::IsMoeBlock(int block_id) const {
  return Has("moe") && moe_blocks.Selects(block_id);
}

bool DynamismConfig::IsSparseAttentionBlock(int block_id) const {
  return Has("sparse-attention") && attention_blocks.Selects(block_id);
}

bool DynamismConfig::IsModBlock(int block_id) const {
  return Has("mod") && mod_blocks.Selects(block_id);
}

absl::StatusOr<DynamismConfig> ParseDynamism(absl::string_view text) {
  DynamismConfig config;
  if (text.empty() || text == "none") return config;
  for (absl::string_view name : absl::StrSplit(text, ',')) {
    const bool known = std::any_of(std::begin(kDynamismCases), std::end(kDynamismCases),
                                   [&](const char* c) { return name == c; });
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dynamism: unknown case '", name, "' (known: ",
                       absl::StrJoin(kDynamismCases, ", "), ")"));
    }
    if (config.Has(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dynamism: case '", name, "' given twice"));
    }
    config.cases.emplace_back(name);
  }
  return config;
}

namespace {

absl::Status CheckSchedule(absl::string_view name, const DynamismConfig::BlockSchedule& b) {
  if (b.every < 1 || b.first < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, "_every and --", name, "_first must be >= 1, got ", b.every,
        " and ", b.first));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateDynamismParameters(const DynamismConfig& c, int seq_len) {
  if (c.Has("moe")) {
    if (c.moe_experts < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--moe_experts must be >= 2 (top-2 routing), got ", c.moe_experts));
    }
    if (!(c.moe_capacity_factor > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--moe_capacity_factor must be > 0, got ", c.moe_capacity_factor));
    }
    if (!(c.moe_aux_loss_weight >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--moe_aux_loss_weight must be >= 0, got ", c.moe_aux_loss_weight));
    }
    if (absl::Status s = CheckSchedule("moe", c.moe_blocks); !s.ok()) return s;
  }
  if (c.Has("pruning")) {
    if (absl::Status s = ValidatePruningConfig(c.pruning); !s.ok()) return s;
  }
  if (c.Has("sparse-attention")) {
    if (c.attention_block < 1 || c.attention_block > seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--attention_block must be in [1, --seq_len=", seq_len, "], got ",
          c.attention_block));
    }
    if (c.attention_buckets < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--attention_buckets must be >= 1, got ", c.attention_buckets));
    }
    if (c.attention_hash_rounds < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--attention_hash_rounds must be >= 1, got ", c.attention_hash_rounds));
    }
    if (absl::Status s = CheckSchedule("attention", c.attention_blocks); !s.ok()) return s;
  }
  if (c.Has("mod")) {
    if (!(c.mod_capacity > 0 && c.mod_capacity <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mod_capacity must be in (0, 1], got ", c.mod_capacity));
    }
    if (c.mod_routing != "topk" && c.mod_routing != "predictor") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mod_routing must be topk or predictor, not '", c.mod_routing, "'"));
    }
    if (!(c.mod_event_delta > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mod_event_delta must be > 0, got ", c.mod_event_delta));
    }
    if (absl::Status s = CheckSchedule("mod", c.mod_blocks); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
