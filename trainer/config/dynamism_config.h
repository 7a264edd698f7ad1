// DynamismConfig: which dynamic-model schemes (the paper's §2.2 cases) a
// dynmo-train job runs, and their parameters, as a plain struct with its
// parser and validation (no LibTorch). `--dynamism=freezing,early-exit`
// names the cases; each case's parameters have their own flags (see
// trainer/README.md). Cases may combine. Thread-compatible value type.
//
// The schemes themselves live one per file: what a layer computes in
// trainer/model/, the stage hooks in trainer/dynamism/. What they change is
// the layers' real work (fewer multiply-adds, fewer tokens), so the
// per-layer times the trainer measures move, never a formula.
#ifndef DYNMO_TRAINER_CONFIG_DYNAMISM_CONFIG_H_
#define DYNMO_TRAINER_CONFIG_DYNAMISM_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/config/freezing_exit_config.h"
#include "trainer/config/pruning_config.h"

namespace dynmo::trainer {

// The case names `--dynamism` accepts, in the paper's order.
inline constexpr const char* kDynamismCases[] = {
    "moe", "pruning", "freezing", "sparse-attention", "early-exit", "mod"};

struct DynamismConfig {
  std::vector<std::string> cases;  // a subset of kDynamismCases, no repeats

  // Which decoder blocks (ids 1..N) a per-block case touches: blocks
  // first, first + every, first + 2·every, ... (every >= 1, first >= 1).
  struct BlockSchedule {
    int every = 2;
    int first = 2;
    bool Selects(int block_id) const {
      return block_id >= first && (block_id - first) % every == 0;
    }
  };

  // moe: Mixture of Experts MLPs (trainer/model/moe.h).
  int moe_experts = 4;               // --moe_experts
  double moe_capacity_factor = 1.25;  // --moe_capacity_factor
  double moe_aux_loss_weight = 0.01;  // --moe_aux_loss_weight
  BlockSchedule moe_blocks;          // --moe_every, --moe_first

  // sparse-attention: hash-based block-sparse causal attention
  // (trainer/model/sparse_attention.h).
  int attention_block = 16;        // --attention_block: tokens per block
  int attention_buckets = 4;       // --attention_buckets: hash buckets (>= 1)
  int attention_hash_rounds = 1;   // --attention_hash_rounds
  BlockSchedule attention_blocks{1, 1};  // --attention_every, --attention_first

  // mod: Mixture of Depths (trainer/model/mixture_of_depths.h).
  double mod_capacity = 0.25;           // --mod_capacity: fraction of tokens routed
  double mod_predictor_loss_weight = 1.0;  // the causal predictor's BCE weight
  // --mod_routing: "topk" (every sequence's top mod_capacity·T tokens run,
  // a fixed load) or "predictor" (the tokens whose causal predictor logit
  // is > 0 run, in training too: the load moves as the predictor learns).
  std::string mod_routing = "topk";
  // --mod_event_delta: under predictor routing, how far a block's routed
  // fraction moves before "model changed" (mod_load_profile.h).
  double mod_event_delta = 0.05;
  BlockSchedule mod_blocks;             // --mod_every, --mod_first

  // pruning: gradual global magnitude pruning (trainer/dynamism/pruning.h);
  // --prune_start/end/every, --prune_initial/final_sparsity,
  // --prune_csr_min_sparsity.
  PruningConfig pruning;

  // freezing: --freeze_every, --freeze_window, --freeze_threshold,
  // --freeze_max_layers (freezing_exit_config.h).
  FreezingConfig freezing;
  // early-exit: --exit_after, --exit_threshold, --exit_loss_weight,
  // --exit_event_delta, --exit_warmup_iters (freezing_exit_config.h).
  EarlyExitConfig early_exit;

  bool Has(absl::string_view name) const;
  bool empty() const { return cases.empty(); }
  // The per-block cases' decisions for decoder block `block_id`.
  bool IsMoeBlock(int block_id) const;
  bool IsSparseAttentionBlock(int block_id) const;
  bool IsModBlock(int block_id) const;
};

// Parses "freezing,early-exit" ("" or "none": no dynamism). Unknown or
// repeated names are an error naming them and the accepted ones.
absl::StatusOr<DynamismConfig> ParseDynamism(absl::string_view text);

// Checks the parameters of the cases `config` names against the model
// (its sequence length); errors name the offending flag.
absl::Status ValidateDynamismParameters(const DynamismConfig& config, int seq_len);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_CONFIG_DYNAMISM_CONFIG_H_
