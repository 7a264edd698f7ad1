#include "cli/address.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dynmo::cli {
namespace {

bool NameChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_'; }

}  // namespace

absl::Status CheckAddress(absl::string_view flag, absl::string_view address,
                          const AddressRules &rules) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "='", address, "' is not a usable address: ", why));
  };
  for (absl::string_view scheme : {"unix:", "unix-abstract:"}) {
    if (absl::StartsWith(address, scheme)) {
      if (!rules.unix_socket) return bad("a Unix socket is not allowed here");
      if (address.size() == scheme.size()) return bad("the socket path is empty");
      return absl::OkStatus();
    }
  }
  absl::string_view host, port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return bad("'[' without ']'");
    host = address.substr(1, close - 1);
    if (host.empty()) return bad("empty IPv6 address in []");
    for (char c : host) {
      if (!(absl::ascii_isxdigit(c) || c == ':' || c == '.' || c == '%')) {
        return bad("not an IPv6 address in []");
      }
    }
    if (close + 1 >= address.size() || address[close + 1] != ':') {
      return bad("want [IPV6]:PORT");
    }
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return bad("want HOST:PORT");
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.empty() && !rules.empty_host) return bad("no host");
    for (char c : host) {
      if (!NameChar(c)) {
        return bad(c == ':' ? "an IPv6 address goes in [], as in [::1]:50051"
                            : "the host holds a character no host name has");
      }
    }
  }
  int number = -1;
  if (port.empty() || !absl::SimpleAtoi(port, &number) || number < 0 || number > 65535 ||
      !absl::ascii_isdigit(port[0])) {
    return bad("the port is not a number in 0..65535");
  }
  if (number == 0 && !rules.port_zero) return bad("port 0");
  return absl::OkStatus();
}

}  // namespace dynmo::cli
