// LocalRelay: the node relay dynmo-launch runs for its ranks (relay/
// node_relay.h): a NodeRelay listening on relay.sock inside a private
// (mode 0700) directory under $TMPDIR (default /tmp), so only the launching
// user's processes can reach it; the directory is removed when the relay
// stops. The ranks get address() as DYNMO_COORDINATOR and carry on as with
// a direct coordinator; the node's sessions reach the coordinator on one
// stream.
//
// Thread-compatible: start, read address(), destroy, from one thread.
#ifndef DYNMO_LAUNCHER_LOCAL_RELAY_H_
#define DYNMO_LAUNCHER_LOCAL_RELAY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "relay/node_relay.h"

namespace dynmo::launcher {

class LocalRelay {
 public:
  // `config.listen` is set here; everything else (coordinator, job, TLS,
  // token) is the caller's.
  static absl::StatusOr<std::unique_ptr<LocalRelay>> Start(
      relay::NodeRelayConfig config);
  ~LocalRelay();

  LocalRelay(const LocalRelay&) = delete;
  LocalRelay& operator=(const LocalRelay&) = delete;

  // "unix:<dir>/relay.sock"
  const std::string& address() const { return relay_->address(); }
  relay::NodeRelayStats stats() const { return relay_->stats(); }
  std::vector<relay::RankProgress> progress() const { return relay_->progress(); }

 private:
  LocalRelay(std::string dir, std::unique_ptr<relay::NodeRelay> relay)
      : dir_(std::move(dir)), relay_(std::move(relay)) {}
  std::string dir_;
  std::unique_ptr<relay::NodeRelay> relay_;
};

}  // namespace dynmo::launcher

#endif  // DYNMO_LAUNCHER_LOCAL_RELAY_H_
