#include "launcher/local_relay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace dynmo::launcher {
namespace {

void RemoveSocketDir(const std::string& dir) {
  unlink((dir + "/relay.sock").c_str());
  rmdir(dir.c_str());
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalRelay>> LocalRelay::Start(
    relay::NodeRelayConfig config) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/dynmo-relay-XXXXXX");
  // A Unix socket path must fit sockaddr_un (108 bytes).
  if (pattern.size() + sizeof("/relay.sock") > 100) pattern = "/tmp/dynmo-relay-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {  // mode 0700
    return absl::UnavailableError(absl::StrCat(
        "cannot create the relay's socket directory ", pattern, ": ", strerror(errno)));
  }
  config.listen = absl::StrCat("unix:", pattern, "/relay.sock");
  absl::StatusOr<std::unique_ptr<relay::NodeRelay>> relay =
      relay::NodeRelay::Start(config);
  if (!relay.ok()) {
    RemoveSocketDir(pattern);
    return relay.status();
  }
  return std::unique_ptr<LocalRelay>(new LocalRelay(pattern, *std::move(relay)));
}

LocalRelay::~LocalRelay() {
  relay_->Stop();
  RemoveSocketDir(dir_);
}

}  // namespace dynmo::launcher
