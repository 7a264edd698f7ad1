#include "clients/loadgen_relays.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dynmo::clients {

absl::Status LoadgenRelays::Start(int nodes, const std::string& coordinator,
                                  const agent::ClientCredentials& credentials,
                                  const std::string& job, const std::string& host_prefix) {
  if (nodes <= 0) return absl::OkStatus();
  char dir[] = "/tmp/dynmo-loadgen-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    return absl::InternalError("cannot create a directory for the relays' sockets");
  }
  dir_ = dir;
  for (int n = 0; n < nodes; ++n) {
    relay::NodeRelayConfig rc;
    rc.listen = absl::StrCat("unix:", dir_, "/relay-", n, ".sock");
    rc.coordinator = coordinator;
    rc.channel = credentials.channel;
    rc.channel.index = n;
    rc.token = credentials.token;
    rc.job = job;
    rc.host = absl::StrCat(host_prefix, "node-", n);
    absl::StatusOr<std::unique_ptr<relay::NodeRelay>> relay = relay::NodeRelay::Start(rc);
    if (!relay.ok()) return relay.status();
    relays_.push_back(*std::move(relay));
  }
  return absl::OkStatus();
}

std::string LoadgenRelays::address(int node) const {
  return relays_[static_cast<size_t>(node)]->address();
}

nlohmann::json LoadgenRelays::Totals() const {
  int64_t upstream_breaks = 0, upstream_sessions = 0, attached = 0, carried = 0;
  int64_t messages_down = 0, messages_up = 0, upstream_messages = 0;
  int64_t rank_sessions = 0, rank_sessions_ended = 0, stale_sessions = 0;
  for (const auto& relay : relays_) {
    const relay::NodeRelayStats rs = relay->stats();
    upstream_breaks += rs.upstream_breaks;
    upstream_sessions += rs.upstream_sessions;
    attached += rs.attached_ranks;
    carried += rs.upstream_ranks;
    messages_down += rs.messages_down;
    upstream_messages += rs.upstream_messages;
    rank_sessions += rs.rank_sessions;
    rank_sessions_ended += rs.rank_sessions_ended;
    stale_sessions += rs.stale_sessions;
    messages_up += rs.messages_up;
  }
  return {{"relay_upstream_breaks", upstream_breaks},
          {"relay_upstream_sessions_opened", upstream_sessions},
          {"relay_ranks_attached", attached},
          {"relay_messages_down", messages_down},
          {"relay_messages_up", messages_up},
          {"relay_upstream_messages", upstream_messages},
          {"relay_rank_sessions", rank_sessions},
          {"relay_rank_sessions_ended", rank_sessions_ended},
          {"relay_stale_sessions", stale_sessions},
          {"relay_ranks_carried_upstream", carried}};
}

void LoadgenRelays::Stop() {
  for (auto& relay : relays_) relay->Stop();
  relays_.clear();
  if (!dir_.empty()) rmdir(dir_.c_str());
  dir_.clear();
}

}  // namespace dynmo::clients
