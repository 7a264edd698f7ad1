#include "launcher/rank_env.h"

#include <unistd.h>

#include <set>

#include "absl/strings/str_cat.h"

namespace dynmo::launcher {

std::vector<std::string> RankEnvironment(const std::vector<std::string>& base,
                                         const JobEnvironment& job, int rank) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", absl::StrCat(rank)},
      {"LOCAL_RANK", absl::StrCat(rank)},
      {"WORLD_SIZE", absl::StrCat(job.world_size)},
      {"LOCAL_WORLD_SIZE", absl::StrCat(job.world_size)},
      {"MASTER_ADDR", job.master_addr},
      {"MASTER_PORT", absl::StrCat(job.master_port)},
      {"DYNMO_JOB", job.job},
  };
  if (!job.coordinator.empty()) {
    set.push_back({"DYNMO_COORDINATOR", job.coordinator});
  }
  std::set<std::string> replaced = {"DYNMO_COORDINATOR"};
  for (const auto& [key, value] : set) replaced.insert(key);

  std::vector<std::string> env;
  for (const std::string& entry : base) {
    const std::string key = entry.substr(0, entry.find('='));
    if (replaced.count(key) == 0) env.push_back(entry);
  }
  for (const auto& [key, value] : set) env.push_back(absl::StrCat(key, "=", value));
  return env;
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

}  // namespace dynmo::launcher
