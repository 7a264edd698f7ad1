#include "trainer/comm/dist_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dynmo::trainer {

EnvLookup ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

absl::Status ReadInt(const EnvLookup& env, const char* name, int* out) {
  std::optional<std::string> v = env(name);
  if (!v) return absl::OkStatus();
  if (!absl::SimpleAtoi(*v, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", *v,
                     "' is not an integer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DistEnv> ReadDistEnv(const EnvLookup& env) {
  DistEnv d;
  for (auto [name, field] : {std::pair<const char*, int*>{"RANK", &d.rank},
                             {"WORLD_SIZE", &d.world_size},
                             {"LOCAL_RANK", &d.local_rank},
                             {"MASTER_PORT", &d.master_port}}) {
    if (absl::Status s = ReadInt(env, name, field); !s.ok()) return s;
  }
  if (std::optional<std::string> addr = env("MASTER_ADDR")) d.master_addr = *addr;
  if (d.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("WORLD_SIZE must be >= 1, got ", d.world_size));
  }
  if (d.rank < 0 || d.rank >= d.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RANK=", d.rank, " is outside [0, WORLD_SIZE=", d.world_size, ")"));
  }
  if (d.world_size > 1 && !env("MASTER_PORT")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WORLD_SIZE=", d.world_size, " needs MASTER_ADDR and MASTER_PORT"));
  }
  if (d.master_port < 1 || d.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT=", d.master_port, " is not a valid port"));
  }
  return d;
}

int LocalRanks(const EnvLookup& env) {
  for (const char* var : {"LOCAL_WORLD_SIZE", "WORLD_SIZE"}) {
    const std::optional<std::string> v = env(var);
    int n = 0;
    if (v && absl::SimpleAtoi(*v, &n) && n > 0) return n;
  }
  return 1;
}

}  // namespace dynmo::trainer
