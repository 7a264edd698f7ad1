// dynmo-train: one rank of a pipeline- and data-parallel GPT training job.
// Run it under a torchrun-style launcher (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) or alone as a world of one; see trainer/README.md.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/program_info.h"
#include "trainer/comm/dist_env.h"
#include "trainer/config/config.h"
#include "trainer/layout/repack_layout.h"
#include "trainer/layout/reshape_layout.h"
#include "trainer/run/trace_log.h"
#include "trainer/run/trainer.h"
#include "trainer/run/training_log.h"

ABSL_FLAG(int, layers, 4, "decoder blocks (pipeline layers = blocks + embedding + head)");
ABSL_FLAG(std::string, pipeline_units, "blocks",
          "what a pipeline layer between embedding and head is: blocks (a decoder block) "
          "or halves (a block's attention half and MLP half are two layers, so a stage "
          "may hold 1.5 blocks; --dynamism=none only)");
ABSL_FLAG(int, hidden, 64, "hidden size");
ABSL_FLAG(int, heads, 4, "attention heads (must divide --hidden)");
ABSL_FLAG(int, seq_len, 32, "tokens per sample");
ABSL_FLAG(int, vocab, 256, "vocabulary size (256 covers byte-level text)");
ABSL_FLAG(int, micro_batch, 4, "samples per micro-batch");
ABSL_FLAG(int, microbatches, 4, "micro-batches per iteration per dp replica");
ABSL_FLAG(int, steps, 20, "training iterations");
ABSL_FLAG(double, lr, 1e-3, "AdamW learning rate");
ABSL_FLAG(double, weight_decay, 0.01, "AdamW weight decay");
ABSL_FLAG(uint64_t, seed, 1234, "initialisation seed");
ABSL_FLAG(int, pp, 1, "pipeline stages");
ABSL_FLAG(int, dp, 1, "data-parallel replicas (pp * dp must equal WORLD_SIZE)");
ABSL_FLAG(std::string, data, DYNMO_TRAINER_DEFAULT_DATA,
          "plain text file (byte tokens) or Megatron .bin/.idx prefix");
ABSL_FLAG(std::string, initial_boundaries, "",
          "starting partition b0,b1,...,bpp over the pipeline layers (default uniform)");
ABSL_FLAG(std::string, log_json, "", "write one JSON record per iteration to this file");
ABSL_FLAG(int, log_interval, 1, "iterations per progress line");
ABSL_FLAG(int, intra_op_threads, 1, "LibTorch intra-op threads per rank");
ABSL_FLAG(int, test_migrate_every, 0,
          "test policy: migrate every N iterations to the next of --test_migration_boundaries");
ABSL_FLAG(std::string, test_migration_boundaries, "",
          "test policy: ';'-separated partitions b0,...,bpp to cycle through; an "
          "entry 's0,s1,...@b0,...,bk' keeps only those original stages active "
          "(re-packing: the other stages' ranks are released)");
ABSL_FLAG(std::string, test_reshape_at, "",
          "test policy: ITER:PPxDP[:b0,b1,...] re-shapes the job's ranks into a PP x DP "
          "grid before iteration ITER (boundaries over PP stages; default uniform); the "
          "global batch stays, each replica running dp*microbatches/DP micro-batches");
ABSL_FLAG(std::string, coordinator, "",
          "embedded (rank 0 serves one on loopback), HOST:PORT or none "
          "(default: $DYNMO_COORDINATOR if set, else none)");
ABSL_FLAG(std::string, job, "", "job name at the coordinator (default: $DYNMO_JOB, else dynmo)");
ABSL_FLAG(std::string, coordinator_token_file, "",
          "file with the bearer token a secured coordinator requires of agents");
ABSL_FLAG(std::string, coordinator_tls_ca, "",
          "PEM CA of the coordinator's certificate (enables TLS)");
ABSL_FLAG(std::string, coordinator_tls_cert, "",
          "PEM client certificate for a coordinator with mutual TLS");
ABSL_FLAG(std::string, coordinator_tls_key, "", "PEM key of --coordinator_tls_cert");
ABSL_FLAG(std::string, coordinator_tls_server_name, "",
          "name to check in the coordinator's certificate (default: its host)");
ABSL_FLAG(std::string, balancer, "",
          "job policy: uniform|parameters|time|optimal|diffusion (default: coordinator's)");
ABSL_FLAG(std::string, trigger, "",
          "job policy: every:N|on-event|auto|manual (default: coordinator's)");
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
ABSL_FLAG(std::string, backend, "gloo",
          "c10d backend: gloo (CPU) or nccl (needs a CUDA LibTorch build with NCCL)");
ABSL_FLAG(std::string, device, "auto",
          "where layers compute: auto (cuda when a GPU is visible, else cpu), cpu, "
          "cuda (cuda:LOCAL_RANK) or cuda:N");
ABSL_FLAG(std::string, layer_clock, "wall",
          "what per-layer times measure on cpu: wall (steady clock) or cpu (CPU time "
          "of the computing thread; robust when ranks share cores)");
ABSL_FLAG(int, timeout_s, 300, "rendezvous and communication timeout, seconds");
ABSL_FLAG(std::string, save_dir, "",
          "write per-layer checkpoints under DIR/iter_<k>/ (layer_<id>.state + manifest.json)");
ABSL_FLAG(int, save_every, 0,
          "checkpoint every N iterations (0: only after the last; needs --save_dir)");
ABSL_FLAG(std::string, load_dir, "",
          "resume from the newest complete checkpoint under DIR (any --pp/--dp)");
ABSL_FLAG(double, memory_capacity_gb, 0,
          "memory capacity per rank reported to the coordinator, GiB "
          "(0: physical memory / ranks on this host)");
ABSL_FLAG(std::string, trace, "",
          "rank 0 writes every iteration's per-layer profile to FILE "
          "(JSON Lines, what dynmo-sim --trace replays)");
ABSL_FLAG(bool, profile_layers, true,
          "clock every layer's forward and backward (false: one clock per stage pass)");
ABSL_FLAG(bool, repack, false,
          "job policy: let the coordinator re-pack onto fewer stages, releasing ranks");
ABSL_FLAG(double, repack_tolerance, 0,
          "job policy: bottleneck loss in [0, 10] a re-pack may cost (with --repack)");
ABSL_FLAG(std::string, elastic, "",
          "job policy: what re-packing does with freed ranks: release (hand them "
          "back) or reshape (run more data-parallel replicas of a shorter "
          "pipeline, regrouped live); empty: the coordinator's default");
ABSL_FLAG(int, coordinator_connect_timeout_s, 10,
          "a HOST:PORT coordinator not reached within this many seconds at start-up "
          "is an error");

namespace {

using dynmo::trainer::TrainerConfig;

absl::StatusOr<TrainerConfig> ConfigFromFlags() {
  TrainerConfig c;
  c.model.num_blocks = absl::GetFlag(FLAGS_layers);
  c.model.pipeline_units = absl::GetFlag(FLAGS_pipeline_units);
  c.model.hidden = absl::GetFlag(FLAGS_hidden);
  c.model.heads = absl::GetFlag(FLAGS_heads);
  c.model.seq_len = absl::GetFlag(FLAGS_seq_len);
  c.model.vocab = absl::GetFlag(FLAGS_vocab);
  c.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  c.microbatches = absl::GetFlag(FLAGS_microbatches);
  c.steps = absl::GetFlag(FLAGS_steps);
  c.lr = absl::GetFlag(FLAGS_lr);
  c.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.pp = absl::GetFlag(FLAGS_pp);
  c.dp = absl::GetFlag(FLAGS_dp);
  c.data = absl::GetFlag(FLAGS_data);
  c.log_json = absl::GetFlag(FLAGS_log_json);
  c.log_interval = absl::GetFlag(FLAGS_log_interval);
  c.intra_op_threads = absl::GetFlag(FLAGS_intra_op_threads);
  c.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  c.backend = absl::GetFlag(FLAGS_backend);
  c.device = absl::GetFlag(FLAGS_device);
  c.layer_clock = absl::GetFlag(FLAGS_layer_clock);
  c.save_dir = absl::GetFlag(FLAGS_save_dir);
  c.save_every = absl::GetFlag(FLAGS_save_every);
  c.load_dir = absl::GetFlag(FLAGS_load_dir);
  c.memory_capacity_bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_memory_capacity_gb) * (1LL << 30));
  c.trace = absl::GetFlag(FLAGS_trace);
  c.profile_layers = absl::GetFlag(FLAGS_profile_layers);
  absl::StatusOr<dynmo::trainer::DynamismConfig> dynamism =
      dynmo::trainer::ParseDynamism(absl::GetFlag(FLAGS_dynamism));
  if (!dynamism.ok()) return dynamism.status();
  c.model.dynamism = *dynamism;
  {
    dynmo::trainer::DynamismConfig& d = c.model.dynamism;
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
  }
  if (std::string b = absl::GetFlag(FLAGS_initial_boundaries); !b.empty()) {
    absl::StatusOr<dynmo::core::Boundaries> parsed = dynmo::trainer::ParseBoundaries(b);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--initial_boundaries: ", parsed.status().message()));
    }
    c.initial_boundaries = *parsed;
  }
  c.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (c.coordinator.empty()) {
    const char* env = std::getenv("DYNMO_COORDINATOR");
    c.coordinator = env != nullptr && *env != '\0' ? env : "none";
  }
  if (c.coordinator != "none" && c.coordinator != "embedded" &&
      (c.coordinator.find(':') == std::string::npos ||
       c.coordinator.find(' ') != std::string::npos)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--coordinator must be embedded, none or HOST:PORT, not '", c.coordinator, "'"));
  }
  c.coordinator_token_file = absl::GetFlag(FLAGS_coordinator_token_file);
  c.coordinator_tls_ca = absl::GetFlag(FLAGS_coordinator_tls_ca);
  c.coordinator_tls_cert = absl::GetFlag(FLAGS_coordinator_tls_cert);
  c.coordinator_tls_key = absl::GetFlag(FLAGS_coordinator_tls_key);
  c.coordinator_tls_server_name = absl::GetFlag(FLAGS_coordinator_tls_server_name);
  if (c.coordinator_tls_cert.empty() != c.coordinator_tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator_tls_cert and --coordinator_tls_key go together");
  }
  c.job = absl::GetFlag(FLAGS_job);
  if (c.job.empty()) {
    const char* env = std::getenv("DYNMO_JOB");
    c.job = env != nullptr && *env != '\0' ? env : "dynmo";
  }
  c.balancer = absl::GetFlag(FLAGS_balancer);
  c.trigger = absl::GetFlag(FLAGS_trigger);
  c.test_migrate_every = absl::GetFlag(FLAGS_test_migrate_every);
  if (std::string list = absl::GetFlag(FLAGS_test_migration_boundaries); !list.empty()) {
    bool names_stages = false;
    for (absl::string_view entry : absl::StrSplit(list, ';')) {
      absl::StatusOr<dynmo::trainer::LayoutTarget> parsed =
          dynmo::trainer::ParseLayoutTarget(entry);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--test_migration_boundaries: ", parsed.status().message()));
      }
      c.test_migration_targets.push_back(parsed->boundaries);
      c.test_migration_stages.push_back(parsed->active_stages);
      names_stages = names_stages || !parsed->active_stages.empty();
    }
    if (!names_stages) c.test_migration_stages.clear();
  }
  if (std::string at = absl::GetFlag(FLAGS_test_reshape_at); !at.empty()) {
    absl::StatusOr<dynmo::trainer::ReshapeAt> parsed = dynmo::trainer::ParseReshapeAt(at);
    if (!parsed.ok()) return parsed.status();
    c.test_reshape_at = parsed->iteration;
    c.test_reshape_pp = parsed->target.pp;
    c.test_reshape_dp = parsed->target.dp;
    c.test_reshape_boundaries = parsed->target.boundaries;
  }
  c.repack = absl::GetFlag(FLAGS_repack);
  c.repack_tolerance = absl::GetFlag(FLAGS_repack_tolerance);
  c.elastic = absl::GetFlag(FLAGS_elastic);
  c.coordinator_connect_timeout_s = absl::GetFlag(FLAGS_coordinator_connect_timeout_s);
  return c;
}

int Fail(const absl::Status& status) {
  std::cerr << "dynmo-train: error: " << status.message() << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dynmo-train [--flags]: one rank of a pipeline-parallel GPT job "
      "(RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the launcher)");
  if (dynmo::cli::HandleHelpOrVersion(argc, argv, "dynmo-train",
                                       absl::ProgramUsageMessage())) {
    return 0;
  }
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional[1], "'")));
  }
  absl::StatusOr<dynmo::trainer::DistEnv> env =
      dynmo::trainer::ReadDistEnv(dynmo::trainer::ProcessEnv());
  if (!env.ok()) return Fail(env.status());
  absl::StatusOr<TrainerConfig> config = ConfigFromFlags();
  if (!config.ok()) return Fail(config.status());
  if (absl::Status s = dynmo::trainer::ValidateConfig(*config, env->world_size); !s.ok()) {
    return Fail(s);
  }

  std::optional<dynmo::trainer::JsonLogWriter> json;
  if (env->rank == 0 && !config->log_json.empty()) {
    absl::StatusOr<dynmo::trainer::JsonLogWriter> w =
        dynmo::trainer::JsonLogWriter::Open(config->log_json);
    if (!w.ok()) return Fail(w.status());
    json.emplace(std::move(*w));
  }
  if (env->rank == 0) {
    absl::StatusOr<dynmo::core::Boundaries> b = dynmo::trainer::StartingBoundaries(*config);
    std::cout << "dynmo-train: world " << env->world_size << " = pp " << config->pp
              << " x dp " << config->dp << ", " << config->model.num_pipeline_layers()
              << " pipeline layers, boundaries "
              << (b.ok() ? absl::StrJoin(*b, ",") : "?") << ", data " << config->data
              << ", coordinator " << config->coordinator << " (job " << config->job
              << ")" << std::endl;
  }

  std::vector<dynmo::trainer::IterationRecord> window;
  double tokens_per_s_sum = 0;
  std::optional<dynmo::trainer::TraceWriter> trace;
  int records = 0;
  dynmo::trainer::IterationRecord last;
  bool logged_last = false;  // this process was rank 0 at the last iteration
  absl::Status status = dynmo::trainer::RunTraining(
      *config, *env, [&](const dynmo::trainer::IterationRecord& r) -> absl::Status {
        // Records come to whichever process is rank 0 now: after a re-pack
        // that released the first stage, a survivor continues the log.
        if (!json && !config->log_json.empty()) {
          absl::StatusOr<dynmo::trainer::JsonLogWriter> w =
              dynmo::trainer::JsonLogWriter::Open(config->log_json, /*append=*/true);
          if (!w.ok()) return w.status();
          json.emplace(std::move(*w));
        }
        if (json) {
          if (absl::Status s = json->Write(r); !s.ok()) return s;
        }
        if (!trace && !config->trace.empty()) {
          absl::StatusOr<dynmo::trainer::TraceWriter> w = dynmo::trainer::TraceWriter::Open(
              config->trace, /*append=*/env->rank != 0);
          if (!w.ok()) return w.status();
          trace.emplace(std::move(*w));
        }
        if (trace) {
          if (absl::Status s = trace->Write(r, r.microbatches); !s.ok()) return s;
        }
        window.push_back(r);
        tokens_per_s_sum += r.tokens_per_s;
        ++records;
        last = r;
        logged_last = r.iter + 1 == config->steps;
        if (static_cast<int>(window.size()) == config->log_interval ||
            r.iter + 1 == config->steps) {
          std::cout << dynmo::trainer::FormatProgressLine(window) << std::endl;
          window.clear();
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return Fail(status);
  if (logged_last) {
    std::printf("dynmo-train: done, %d iterations, final loss %.4f, mean %.0f tok/s\n",
                config->steps, last.loss, tokens_per_s_sum / records);
  }
  return 0;
}
