#include "coordinator/tools/cli_args.h"

#include <cmath>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dynmo::tools {

absl::StatusOr<CliArgs> CliArgs::Parse(
    int argc, const char* const* argv, const std::set<std::string>& value_flags,
    const std::set<std::string>& bool_flags) {
  CliArgs args;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (flags_done || arg.size() < 2 || arg.rfind("--", 0) != 0) {
      if (!flags_done && arg.size() > 1 && arg[0] == '-') {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown flag '", arg, "' (flags start with --)"));
      }
      args.positional_.push_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (args.values_.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", name, " given more than once"));
    }
    if (bool_flags.count(name)) {
      if (value && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " takes no value"));
      }
      if (!value || *value == "true") args.values_[name] = "true";
      continue;
    }
    if (!value_flags.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name));
    }
    if (!value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value"));
      }
      value = argv[++i];
    }
    args.values_[name] = *value;
  }
  return args;
}

bool CliArgs::Has(absl::string_view name) const {
  return values_.find(name) != values_.end();
}

std::optional<std::string> CliArgs::Get(absl::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::optional<double>> CliArgs::GetDouble(
    absl::string_view name) const {
  auto v = Get(name);
  if (!v) return std::optional<double>();
  double d;
  if (!absl::SimpleAtod(*v, &d) || !std::isfinite(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", name, " wants a number, got '", *v, "'"));
  }
  return std::optional<double>(d);
}

absl::StatusOr<std::optional<int>> CliArgs::GetInt(
    absl::string_view name) const {
  auto v = Get(name);
  if (!v) return std::optional<int>();
  int n;
  if (!absl::SimpleAtoi(*v, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("flag --", name, " wants an integer, got '", *v, "'"));
  }
  return std::optional<int>(n);
}

int FailUsage(absl::string_view tool, absl::string_view message) {
  std::cerr << tool << ": " << message << "\n";
  return kUsageExit;
}

}  // namespace dynmo::tools
