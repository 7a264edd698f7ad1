#include "cli/coordinator_flags.h"

#include "cli/address.h"

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, coordinator_token_file, "",
          "file with the bearer token a secured coordinator requires");
ABSL_FLAG(std::string, coordinator_tls_ca, "",
          "PEM CA of the coordinator's certificate (enables TLS)");
ABSL_FLAG(std::string, coordinator_tls_cert, "",
          "PEM client certificate for a coordinator with mutual TLS (with _key)");
ABSL_FLAG(std::string, coordinator_tls_key, "", "PEM key of --coordinator_tls_cert");
ABSL_FLAG(std::string, coordinator_tls_server_name, "",
          "name to check in the coordinator's certificate (default: its host)");

namespace dynmo::cli {

absl::StatusOr<CoordinatorClientFlags> ReadCoordinatorClientFlags() {
  CoordinatorClientFlags f;
  f.token_file = absl::GetFlag(FLAGS_coordinator_token_file);
  f.tls_ca = absl::GetFlag(FLAGS_coordinator_tls_ca);
  f.tls_cert = absl::GetFlag(FLAGS_coordinator_tls_cert);
  f.tls_key = absl::GetFlag(FLAGS_coordinator_tls_key);
  f.tls_server_name = absl::GetFlag(FLAGS_coordinator_tls_server_name);
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator_tls_cert and --coordinator_tls_key go together");
  }
  return f;
}

absl::Status CheckCoordinatorAddress(absl::string_view coordinator) {
  if (coordinator == "embedded" || coordinator == "none") return absl::OkStatus();
  if (absl::Status s = CheckAddress("coordinator", coordinator); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--coordinator must be embedded, none or HOST:PORT, not '", coordinator, "' (",
        s.message(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace dynmo::cli
