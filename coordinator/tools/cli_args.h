// A strict command-line parser for the decision-core tools (dynmo-plan,
// dynmo-sim). Their documented contract uses hyphenated flags
// (`--stage-times`) and must exit with status 2 on an unknown flag; absl flags
// can declare neither, so these two tools parse with this small class while
// the daemons use absl flags.
//
// Accepts `--name=value`, `--name value` and bare boolean `--name`; anything
// not starting with `--` is a positional argument; `--` ends flag parsing.
#ifndef DYNMO_COORDINATOR_TOOLS_CLI_ARGS_H_
#define DYNMO_COORDINATOR_TOOLS_CLI_ARGS_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynmo::tools {

// Exit status for every usage or input error, per the CLI contract.
inline constexpr int kUsageExit = 2;

class CliArgs {
 public:
  // `value_flags` take a value, `bool_flags` do not. Unknown flags, missing
  // values and repeated flags are errors.
  static absl::StatusOr<CliArgs> Parse(int argc, const char* const* argv,
                                       const std::set<std::string>& value_flags,
                                       const std::set<std::string>& bool_flags);

  bool Has(absl::string_view name) const;
  std::optional<std::string> Get(absl::string_view name) const;
  // The flag as a number; errors name the flag and the bad text.
  absl::StatusOr<std::optional<double>> GetDouble(absl::string_view name) const;
  absl::StatusOr<std::optional<int>> GetInt(absl::string_view name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::string> positional_;
};

// Prints "<tool>: <message>" on stderr and returns kUsageExit.
int FailUsage(absl::string_view tool, absl::string_view message);

}  // namespace dynmo::tools

#endif  // DYNMO_COORDINATOR_TOOLS_CLI_ARGS_H_
