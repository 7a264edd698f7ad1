// dynmo-loadgen's node relays (--relay_ranks_per_node): one relay::NodeRelay
// per simulated node, each on its own Unix-domain socket in a private
// directory and with its own upstream connection, as separate processes
// would be; and their counters summed for the summary. Not thread-safe:
// loadgen's main thread owns it.
#ifndef DYNMO_CLIENTS_LOADGEN_RELAYS_H_
#define DYNMO_CLIENTS_LOADGEN_RELAYS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/client_credentials.h"
#include "nlohmann/json.hpp"
#include "relay/node_relay.h"

namespace dynmo::clients {

class LoadgenRelays {
 public:
  // No relays: Totals() all zero.
  LoadgenRelays() = default;
  ~LoadgenRelays() { Stop(); }
  LoadgenRelays(const LoadgenRelays&) = delete;
  LoadgenRelays& operator=(const LoadgenRelays&) = delete;

  // `nodes` relays, node n named "<host_prefix>node-<n>", upstream to
  // `coordinator` with `credentials` (channel index n each).
  absl::Status Start(int nodes, const std::string& coordinator,
                     const agent::ClientCredentials& credentials, const std::string& job,
                     const std::string& host_prefix);

  // Node n's relay address ("unix:...").
  std::string address(int node) const;

  // The relays' counters summed, as the summary's "relay_*" fields.
  nlohmann::json Totals() const;

  // Stops every relay and removes the sockets' directory; idempotent.
  void Stop();

 private:
  std::string dir_;
  std::vector<std::unique_ptr<relay::NodeRelay>> relays_;
};

}  // namespace dynmo::clients

#endif  // DYNMO_CLIENTS_LOADGEN_RELAYS_H_
