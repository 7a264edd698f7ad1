// RankServer: a node relay's server side, AgentService for the node's ranks
// (usually on a Unix-domain socket). A rank's Register is passed upstream as
// it is (CallForwarder), so the coordinator sees the rank's own epoch,
// layout and held plan; on success the key it issued is recorded
// (Membership) and the rank's older session, now stale, is ended before the
// rank gets the answer (its Session hello may follow at once). A rank's
// Session is a RankSession reactor: its hello binds it to the rank, its
// reports and acks are queued for the upstream session and kicked up, and
// the plan messages Upstream writes to its outbox go down to the rank.
// Downstream there is no credential check: the socket's directory is the
// guard (dynmo-launch uses a private mkdtemp directory).
//
// Thread-safe: gRPC's callback threads call it; the relay's mutex (given to
// the constructor) guards the Membership. Everything given outlives it.
#ifndef DYNMO_RELAY_RANK_SERVER_H_
#define DYNMO_RELAY_RANK_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/channel.h"
#include "relay/call_forwarder.h"
#include "relay/membership.h"
#include "relay/upstream.h"

namespace dynmo::relay {

class RankServer final : public dynmo::v1::AgentService::CallbackService {
 public:
  RankServer(absl::Mutex* mu, Membership* members, Upstream* upstream,
             CallForwarder* forwarder, std::shared_ptr<grpc::Channel> channel,
             std::string job);

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const dynmo::v1::RegisterRequest* request,
                                     dynmo::v1::RegisterResponse* response) override;
  grpc::ServerBidiReactor<dynmo::v1::AgentMessage, dynmo::v1::CoordinatorMessage>*
  Session(grpc::CallbackServerContext* context) override;

 private:
  class RankSession;

  // One message of a rank's session (*rank: -1 until its hello binds it).
  absl::Status Receive(int* rank, const std::shared_ptr<RankOutbox>& out,
                       const dynmo::v1::AgentMessage& message);
  void Leave(int rank, const RankOutbox* out);

  absl::Mutex* const mu_;
  Membership* const members_;  // guarded by *mu_
  Upstream* const upstream_;
  CallForwarder* const forwarder_;
  const std::unique_ptr<dynmo::v1::AgentService::Stub> stub_;
  const std::string job_;
};

}  // namespace dynmo::relay

#endif  // DYNMO_RELAY_RANK_SERVER_H_
