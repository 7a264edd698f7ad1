#include "cli/program_info.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#ifndef DYNMO_VERSION
#define DYNMO_VERSION "0.0.0"
#endif

namespace dynmo::cli {

std::string Version() { return DYNMO_VERSION; }

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, " (DynMo) ", DYNMO_VERSION);
}

bool HandleHelpOrVersion(int argc, char** argv, absl::string_view program,
                         absl::string_view usage) {
  bool help = false, version = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") break;
    help = help || a == "--help" || a == "-h" || a == "--helpfull" || a == "-help";
    version = version || a == "--version";
  }
  if (version) {
    std::printf("%s\n", VersionLine(program).c_str());
    return true;
  }
  if (!help) return false;
  std::printf("%s\n", std::string(usage).c_str());
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!absl::StrContains(flag->Filename(), "absl/")) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  if (!flags.empty()) std::printf("\nflags:\n");
  for (const absl::CommandLineFlag* f : flags) {
    std::printf("  --%s (default \"%s\")\n      %s\n", std::string(f->Name()).c_str(),
                f->DefaultValue().c_str(), f->Help().c_str());
  }
  std::printf("  --help, --version\n");
  return true;
}

}  // namespace dynmo::cli
