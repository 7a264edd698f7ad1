// ParseFlags: argv into the program's absl flags with the project's rule
// for a bad command line — one line on stderr and exit code 2 — where
// absl::ParseCommandLine prints several lines and exits 1 for an unknown
// flag or a value that does not parse. Every value still goes through the
// flag's own absl parser; then absl::ParseCommandLine runs over the same
// argv (so --flagfile and friends keep working) and cannot fail.
// Call after cli::HandleHelpOrVersion. Not thread-safe (flags are global).
#ifndef DYNMO_CLI_FLAG_PARSE_H_
#define DYNMO_CLI_FLAG_PARSE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynmo::cli {

// The positional arguments (argv[0] first), or INVALID_ARGUMENT naming the
// bad flag: unknown, without its value, or a value its parser refuses.
// Everything after a lone "--" is positional.
absl::StatusOr<std::vector<char *>> ParseFlags(int argc, char **argv);

// ParseFlags, or "PROGRAM: why (see PROGRAM --help)" on stderr and exit(2).
// With `max_positional` >= 0, more positional arguments than that (after
// argv[0]) are a bad command line too.
std::vector<char *> ParseFlagsOrExit(int argc, char **argv, absl::string_view program,
                                     int max_positional = -1);

// Prints "PROGRAM: why (see PROGRAM --help)" on stderr and returns 2, the
// exit code of a bad command line.
int BadCommandLine(absl::string_view program, absl::string_view why);

}  // namespace dynmo::cli

#endif  // DYNMO_CLI_FLAG_PARSE_H_
