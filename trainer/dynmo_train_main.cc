// dynmo-train: one rank of a pipeline- and data-parallel GPT training job.
// Run it under a torchrun-style launcher (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) or alone as a world of one; see trainer/README.md.
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
#include "trainer/config.h"
#include "trainer/dist_env.h"
#include "trainer/trainer.h"
#include "trainer/training_log.h"

ABSL_FLAG(int, layers, 4, "decoder blocks (pipeline layers = blocks + embedding + head)");
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
          "test policy: ';'-separated partitions b0,...,bpp to cycle through");
ABSL_FLAG(std::string, coordinator, "",
          "embedded (rank 0 serves one on loopback), HOST:PORT or none "
          "(default: $DYNMO_COORDINATOR if set, else none)");
ABSL_FLAG(std::string, job, "", "job name at the coordinator (default: $DYNMO_JOB, else dynmo)");
ABSL_FLAG(std::string, balancer, "",
          "job policy: uniform|parameters|time|optimal|diffusion (default: coordinator's)");
ABSL_FLAG(std::string, trigger, "",
          "job policy: every:N|on-event|auto|manual (default: coordinator's)");
ABSL_FLAG(int, timeout_s, 300, "rendezvous and communication timeout, seconds");

namespace {

using dynmo::trainer::TrainerConfig;

absl::StatusOr<TrainerConfig> ConfigFromFlags() {
  TrainerConfig c;
  c.model.num_blocks = absl::GetFlag(FLAGS_layers);
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
  c.job = absl::GetFlag(FLAGS_job);
  if (c.job.empty()) {
    const char* env = std::getenv("DYNMO_JOB");
    c.job = env != nullptr && *env != '\0' ? env : "dynmo";
  }
  c.balancer = absl::GetFlag(FLAGS_balancer);
  c.trigger = absl::GetFlag(FLAGS_trigger);
  c.test_migrate_every = absl::GetFlag(FLAGS_test_migrate_every);
  if (std::string list = absl::GetFlag(FLAGS_test_migration_boundaries); !list.empty()) {
    for (absl::string_view entry : absl::StrSplit(list, ';')) {
      absl::StatusOr<dynmo::core::Boundaries> parsed =
          dynmo::trainer::ParseBoundaries(entry);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--test_migration_boundaries: ", parsed.status().message()));
      }
      c.test_migration_targets.push_back(*parsed);
    }
  }
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
  dynmo::trainer::IterationRecord last;
  absl::Status status = dynmo::trainer::RunTraining(
      *config, *env, [&](const dynmo::trainer::IterationRecord& r) -> absl::Status {
        if (json) {
          if (absl::Status s = json->Write(r); !s.ok()) return s;
        }
        window.push_back(r);
        tokens_per_s_sum += r.tokens_per_s;
        last = r;
        if (static_cast<int>(window.size()) == config->log_interval ||
            r.iter + 1 == config->steps) {
          std::cout << dynmo::trainer::FormatProgressLine(window) << std::endl;
          window.clear();
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return Fail(status);
  if (env->rank == 0) {
    std::printf("dynmo-train: done, %d iterations, final loss %.4f, mean %.0f tok/s\n",
                config->steps, last.loss, tokens_per_s_sum / config->steps);
  }
  return 0;
}
