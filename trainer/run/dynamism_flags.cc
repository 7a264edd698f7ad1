// dynmo-train's dynamism flags: --dynamism and each dynamic case's knobs.
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "trainer/run/train_flags.h"

ABSL_FLAG(std::string, dynamism, "none",
          "dynamic-model cases, comma-separated: moe,pruning,freezing,"
          "sparse-attention,early-exit,mod (or none)");
// --dynamism=moe (trainer/model/moe.h).
ABSL_FLAG(int, moe_experts, 4, "moe: experts per MoE block (top-2 routing)");
ABSL_FLAG(double, moe_capacity_factor, 1.25,
          "moe: per-expert capacity = factor * tokens * 2 / experts; extra tokens are dropped");
ABSL_FLAG(double, moe_aux_loss_weight, 0.01, "moe: weight of the load-balancing loss");
ABSL_FLAG(int, moe_every, 2, "moe: every k-th decoder block is an MoE block");
ABSL_FLAG(int, moe_first, 2, "moe: the first MoE block (1-based block id)");
// --dynamism=sparse-attention (trainer/model/sparse_attention.h).
ABSL_FLAG(int, attention_block, 16, "sparse-attention: tokens per attention block");
ABSL_FLAG(int, attention_buckets, 4, "sparse-attention: hash buckets per round");
ABSL_FLAG(int, attention_hash_rounds, 1,
          "sparse-attention: hash rounds (a block pair is attended if any round matches)");
ABSL_FLAG(int, attention_every, 1, "sparse-attention: every k-th block hashes its attention");
ABSL_FLAG(int, attention_first, 1, "sparse-attention: the first hashed block (1-based)");
// --dynamism=mod (trainer/model/mixture_of_depths.h).
ABSL_FLAG(double, mod_capacity, 0.25, "mod: fraction of each sequence's tokens a MoD block runs");
ABSL_FLAG(int, mod_every, 2, "mod: every k-th decoder block routes its tokens");
ABSL_FLAG(int, mod_first, 2, "mod: the first MoD block (1-based block id)");
ABSL_FLAG(std::string, mod_routing, "topk",
          "mod: which tokens a MoD block runs: topk (the top --mod_capacity of each "
          "sequence, a fixed load) or predictor (those whose causal predictor logit is > 0, "
          "a load that moves as the predictor learns)");
ABSL_FLAG(double, mod_event_delta, 0.05,
          "mod, predictor routing: a MoD block's routed fraction moving by this much "
          "reports 'model changed'");
// --dynamism=pruning (trainer/dynamism/pruning.h): the Zhu & Gupta schedule
// S_t = S_f + (S_i - S_f)(1 - (t - t0)/(n dt))^3 at t = start, start + every, ..., end.
ABSL_FLAG(int64_t, prune_start, 3000, "pruning: first pruning iteration t0");
ABSL_FLAG(int64_t, prune_end, 7000, "pruning: last pruning iteration t0 + n*dt");
ABSL_FLAG(int64_t, prune_every, 1000, "pruning: iterations between pruning steps (dt)");
ABSL_FLAG(double, prune_initial_sparsity, 0.0, "pruning: S_i, sparsity of the first step");
ABSL_FLAG(double, prune_final_sparsity, 0.9, "pruning: S_f, global sparsity at --prune_end");
ABSL_FLAG(std::string, prune_form, "timed",
          "pruning: how a pruned matrix picks masked dense vs CSR: timed (the faster on "
          "this device, from --prune_csr_min_sparsity on) or threshold (CSR from "
          "--prune_csr_min_sparsity on)");
ABSL_FLAG(double, prune_csr_min_sparsity, 0.8,
          "pruning: a weight matrix switches from dense+mask to CSR kernels once its "
          "own sparsity reaches this (1: never)");
// --dynamism=freezing (trainer/dynamism/freezing.h).
ABSL_FLAG(int, freeze_every, 10, "freezing: iterations between plasticity checks");
ABSL_FLAG(int, freeze_window, 2,
          "freezing: consecutive checks below --freeze_threshold before a layer freezes");
ABSL_FLAG(double, freeze_threshold, 0.3,
          "freezing: plasticity (parameter change per check interval relative to the "
          "layer's first one) under which a layer counts as converged");
ABSL_FLAG(int, freeze_max_layers, 0,
          "freezing: most pipeline layers (from the embedding) that may freeze; 0 = all "
          "but the head");
// --dynamism=early-exit (trainer/model/early_exit.h).
ABSL_FLAG(int, exit_after, 2, "early-exit: first decoder block (1-based) with an exit point");
ABSL_FLAG(double, exit_threshold, 0.9,
          "early-exit: a token exits when its exit head's top probability reaches this");
ABSL_FLAG(double, exit_loss_weight, 0.1, "early-exit: weight of each exit point's loss");
ABSL_FLAG(double, exit_event_delta, 0.05,
          "early-exit: profile change (fraction of tokens in flight) reported as an event");
ABSL_FLAG(int, exit_warmup_iters, 0,
          "early-exit: iterations before tokens may exit (exit heads train from the start)");

namespace dynmo::trainer {

absl::Status ReadDynamismFlags(TrainerConfig& c) {
  absl::StatusOr<DynamismConfig> dynamism = ParseDynamism(absl::GetFlag(FLAGS_dynamism));
  if (!dynamism.ok()) return dynamism.status();
  c.model.dynamism = *dynamism;
  DynamismConfig& d = c.model.dynamism;
  d.moe_experts = absl::GetFlag(FLAGS_moe_experts);
  d.moe_capacity_factor = absl::GetFlag(FLAGS_moe_capacity_factor);
  d.moe_aux_loss_weight = absl::GetFlag(FLAGS_moe_aux_loss_weight);
  d.moe_blocks = {absl::GetFlag(FLAGS_moe_every), absl::GetFlag(FLAGS_moe_first)};
  d.attention_block = absl::GetFlag(FLAGS_attention_block);
  d.attention_buckets = absl::GetFlag(FLAGS_attention_buckets);
  d.attention_hash_rounds = absl::GetFlag(FLAGS_attention_hash_rounds);
  d.attention_blocks = {absl::GetFlag(FLAGS_attention_every),
                        absl::GetFlag(FLAGS_attention_first)};
  d.mod_capacity = absl::GetFlag(FLAGS_mod_capacity);
  d.mod_blocks = {absl::GetFlag(FLAGS_mod_every), absl::GetFlag(FLAGS_mod_first)};
  d.mod_routing = absl::GetFlag(FLAGS_mod_routing);
  d.mod_event_delta = absl::GetFlag(FLAGS_mod_event_delta);
  d.pruning.start = absl::GetFlag(FLAGS_prune_start);
  d.pruning.end = absl::GetFlag(FLAGS_prune_end);
  d.pruning.every = absl::GetFlag(FLAGS_prune_every);
  d.pruning.initial_sparsity = absl::GetFlag(FLAGS_prune_initial_sparsity);
  d.pruning.final_sparsity = absl::GetFlag(FLAGS_prune_final_sparsity);
  d.pruning.csr_min_sparsity = absl::GetFlag(FLAGS_prune_csr_min_sparsity);
  d.pruning.form = absl::GetFlag(FLAGS_prune_form);
  d.freezing.every = absl::GetFlag(FLAGS_freeze_every);
  d.freezing.window = absl::GetFlag(FLAGS_freeze_window);
  d.freezing.threshold = absl::GetFlag(FLAGS_freeze_threshold);
  d.freezing.max_layers = absl::GetFlag(FLAGS_freeze_max_layers);
  d.early_exit.after = absl::GetFlag(FLAGS_exit_after);
  d.early_exit.threshold = absl::GetFlag(FLAGS_exit_threshold);
  d.early_exit.loss_weight = absl::GetFlag(FLAGS_exit_loss_weight);
  d.early_exit.event_delta = absl::GetFlag(FLAGS_exit_event_delta);
  d.early_exit.warmup_iters = absl::GetFlag(FLAGS_exit_warmup_iters);
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
