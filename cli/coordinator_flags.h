// The flags of every program that reaches the coordinator as a client
// (dynmo-train's ranks, dynmo-launch's relay, dynmo-ctl, dynmo-loadgen),
// declared once here:
//
//   --coordinator_token_file F       bearer token for a secured coordinator
//   --coordinator_tls_ca F           PEM CA of its certificate (enables TLS)
//   --coordinator_tls_cert F         PEM client certificate (mutual TLS) ...
//   --coordinator_tls_key F          ... and its key (the two go together)
//   --coordinator_tls_server_name N  name to check in its certificate
//
// and the check of a --coordinator value both take (embedded, none or
// HOST:PORT). The programs' own flags stay beside their mains. Reading flags
// is thread-compatible: call after absl::ParseCommandLine, before threads.
#ifndef DYNMO_CLI_COORDINATOR_FLAGS_H_
#define DYNMO_CLI_COORDINATOR_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

ABSL_DECLARE_FLAG(std::string, coordinator_token_file);
ABSL_DECLARE_FLAG(std::string, coordinator_tls_ca);
ABSL_DECLARE_FLAG(std::string, coordinator_tls_cert);
ABSL_DECLARE_FLAG(std::string, coordinator_tls_key);
ABSL_DECLARE_FLAG(std::string, coordinator_tls_server_name);

namespace dynmo::cli {

// How to reach a (possibly secured) coordinator, as the flags say.
struct CoordinatorClientFlags {
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_server_name;

  // A token or TLS is asked for.
  bool secured() const { return !token_file.empty() || !tls_ca.empty(); }
};

// The flags' values; INVALID_ARGUMENT when only one of --coordinator_tls_cert
// and --coordinator_tls_key is given.
absl::StatusOr<CoordinatorClientFlags> ReadCoordinatorClientFlags();

// OK for "embedded", "none" or HOST:PORT; else INVALID_ARGUMENT naming it.
absl::Status CheckCoordinatorAddress(absl::string_view coordinator);

}  // namespace dynmo::cli

#endif  // DYNMO_CLI_COORDINATOR_FLAGS_H_
