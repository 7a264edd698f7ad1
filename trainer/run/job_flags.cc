// dynmo-train's job flags: the coordinator, the job's name and its policy.
// How to reach a secured coordinator: cli/coordinator_flags.h.
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "cli/coordinator_flags.h"
#include "trainer/run/train_flags.h"

ABSL_FLAG(std::string, coordinator, "",
          "embedded (rank 0 serves one on loopback), HOST:PORT or none "
          "(default: $DYNMO_COORDINATOR if set, else none)");
ABSL_FLAG(std::string, job, "", "job name at the coordinator (default: $DYNMO_JOB, else dynmo)");
ABSL_FLAG(std::string, balancer, "",
          "job policy: uniform|parameters|time|optimal|diffusion (default: coordinator's)");
ABSL_FLAG(std::string, trigger, "",
          "job policy: every:N|on-event|auto|manual (default: coordinator's)");
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

namespace dynmo::trainer {
namespace {

// The flag's value, else the environment variable's, else `fallback`.
std::string FlagOrEnv(const std::string& flag, const char* env, const char* fallback) {
  if (!flag.empty()) return flag;
  const char* value = std::getenv(env);
  return value != nullptr && *value != '\0' ? value : fallback;
}

}  // namespace

absl::Status ReadJobFlags(TrainerConfig& c) {
  c.coordinator = FlagOrEnv(absl::GetFlag(FLAGS_coordinator), "DYNMO_COORDINATOR", "none");
  if (absl::Status s = cli::CheckCoordinatorAddress(c.coordinator); !s.ok()) return s;
  absl::StatusOr<cli::CoordinatorClientFlags> client = cli::ReadCoordinatorClientFlags();
  if (!client.ok()) return client.status();
  c.coordinator_client = *std::move(client);
  c.job = FlagOrEnv(absl::GetFlag(FLAGS_job), "DYNMO_JOB", "dynmo");
  c.balancer = absl::GetFlag(FLAGS_balancer);
  c.trigger = absl::GetFlag(FLAGS_trigger);
  c.repack = absl::GetFlag(FLAGS_repack);
  c.repack_tolerance = absl::GetFlag(FLAGS_repack_tolerance);
  c.elastic = absl::GetFlag(FLAGS_elastic);
  c.coordinator_connect_timeout_s = absl::GetFlag(FLAGS_coordinator_connect_timeout_s);
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
