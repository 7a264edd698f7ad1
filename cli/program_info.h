// The two questions every DynMo program answers the same way: --version
// ("dynmo-ctl (DynMo) 0.6.0", exit 0) and --help (the usage line and every
// flag with its default and help text, exit 0 — absl's own --help exits 1).
// Call HandleHelpOrVersion first thing in main, before absl::ParseCommandLine
// or any other parser. Stateless; thread-safe.
#ifndef DYNMO_CLI_PROGRAM_INFO_H_
#define DYNMO_CLI_PROGRAM_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace dynmo::cli {

// The project's version ("0.6.0").
std::string Version();

// "<program> (DynMo) <version>".
std::string VersionLine(absl::string_view program);

// When argv holds --version, or --help / -h / --helpfull, prints the
// answer on stdout and returns true (the caller returns 0). `usage` is the
// program's usage text; absl flags defined outside absl itself are listed
// after it (programs with their own parser list their flags in `usage`).
bool HandleHelpOrVersion(int argc, char** argv, absl::string_view program,
                         absl::string_view usage);

}  // namespace dynmo::cli

#endif  // DYNMO_CLI_PROGRAM_INFO_H_
