// dynmo-train: one rank of a pipeline- and data-parallel GPT training job.
// Run it under a torchrun-style launcher (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) or alone as a world of one; see trainer/README.md. Its flags
// are grouped by concern in train_flags.h; what it prints and logs per
// iteration is progress_sink.h. A bad command line — a flag unknown, not
// parsing, out of range or inconsistent with another or with the launcher's
// world — is one line on stderr and exit 2 (cli/flag_parse.h), as in every
// DynMo program; a run that fails after it started is exit 1.
#include <iostream>
#include <vector>

#include "absl/flags/usage.h"
#include "cli/flag_parse.h"
#include "cli/program_info.h"
#include "trainer/comm/dist_env.h"
#include "trainer/config/config.h"
#include "trainer/run/progress_sink.h"
#include "trainer/run/train_flags.h"
#include "trainer/run/trainer.h"

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "dynmo-train: error: " << status.message() << std::endl;
  return 1;
}

int BadCommandLine(const absl::Status& status) {
  return dynmo::cli::BadCommandLine("dynmo-train", status.message());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dynmo::trainer;
  absl::SetProgramUsageMessage(
      "dynmo-train [--flags]: one rank of a pipeline-parallel GPT job "
      "(RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the launcher)");
  if (dynmo::cli::HandleHelpOrVersion(argc, argv, "dynmo-train",
                                       absl::ProgramUsageMessage())) {
    return 0;
  }
  dynmo::cli::ParseFlagsOrExit(argc, argv, "dynmo-train", /*max_positional=*/0);
  absl::StatusOr<DistEnv> env = ReadDistEnv(ProcessEnv());
  if (!env.ok()) return BadCommandLine(env.status());
  absl::StatusOr<TrainerConfig> config = ConfigFromFlags();
  if (!config.ok()) return BadCommandLine(config.status());
  if (absl::Status s = ValidateConfig(*config, env->world_size); !s.ok()) {
    return BadCommandLine(s);
  }

  ProgressSink sink(*config, *env);
  if (absl::Status s = sink.Start(); !s.ok()) return Fail(s);
  absl::Status status = RunTraining(
      *config, *env, [&sink](const IterationRecord& r) { return sink.Record(r); });
  if (!status.ok()) return Fail(status);
  sink.Finish();
  return 0;
}
