#include "cli/flag_parse.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dynmo::cli {

absl::StatusOr<std::vector<char *>> ParseFlags(int argc, char **argv) {
  std::vector<char *> positional = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) positional.push_back(argv[i]);
      break;
    }
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      positional.push_back(argv[i]);
      continue;
    }
    const absl::string_view body = arg.substr(absl::StartsWith(arg, "--") ? 2 : 1);
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(body, absl::MaxSplits('=', 1));
    const bool has_value = absl::StrContains(body, '=');
    absl::CommandLineFlag *flag = absl::FindCommandLineFlag(kv.first);
    std::string value;
    if (flag == nullptr && !has_value && absl::StartsWith(kv.first, "no")) {
      // --nofoo: a boolean flag foo set to false.
      flag = absl::FindCommandLineFlag(kv.first.substr(2));
      if (flag == nullptr || !flag->IsOfType<bool>()) flag = nullptr;
      value = "false";
    } else if (flag != nullptr && has_value) {
      value = std::string(kv.second);
    } else if (flag != nullptr && flag->IsOfType<bool>()) {
      value = "true";
    } else if (flag != nullptr) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", kv.first, " needs a value"));
      }
      value = argv[++i];
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '--", kv.first, "'"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid value '", value, "' for --", flag->Name(), ": ", error));
    }
  }
  return positional;
}

int BadCommandLine(absl::string_view program, absl::string_view why) {
  std::fprintf(stderr, "%s: %s (see %s --help)\n", std::string(program).c_str(),
               std::string(why).c_str(), std::string(program).c_str());
  return 2;
}

std::vector<char *> ParseFlagsOrExit(int argc, char **argv, absl::string_view program,
                                     int max_positional) {
  absl::StatusOr<std::vector<char *>> positional = ParseFlags(argc, argv);
  if (!positional.ok()) std::exit(BadCommandLine(program, positional.status().message()));
  if (max_positional >= 0 && static_cast<int>(positional->size()) - 1 > max_positional) {
    std::exit(BadCommandLine(
        program, absl::StrCat("unexpected argument '", (*positional)[1 + max_positional], "'")));
  }
  // The same argv again, through absl's own parser: it cannot fail now.
  absl::ParseCommandLine(argc, argv);
  return *std::move(positional);
}

}  // namespace dynmo::cli
