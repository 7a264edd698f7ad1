// CheckAddress: whether a gRPC address flag (--listen, --metrics_listen,
// --coordinator) is one a program can use, so that a typo is one line and
// exit 2 at start-up instead of gRPC's log lines and a failure later:
// HOST:PORT with PORT in 0..65535 and HOST a name, an IPv4 address or a
// bracketed IPv6 address ([::1]:50051), or a Unix socket (unix:PATH,
// unix-abstract:NAME). Pure; thread-safe.
#ifndef DYNMO_CLI_ADDRESS_H_
#define DYNMO_CLI_ADDRESS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dynmo::cli {

struct AddressRules {
  bool empty_host = false;  // ":9464" (listen on every interface)
  bool port_zero = false;   // ":0" (pick a free port)
  bool unix_socket = true;  // unix:PATH
};

// INVALID_ARGUMENT naming `flag` and what is wrong with `address`.
absl::Status CheckAddress(absl::string_view flag, absl::string_view address,
                          const AddressRules &rules = {});

}  // namespace dynmo::cli

#endif  // DYNMO_CLI_ADDRESS_H_
