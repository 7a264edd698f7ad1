// CallForwarder: passes one unary call of a rank upstream as it is — the
// answer or the error comes back unchanged — under the relay's deadline and
// with the upstream credential: the relay's own token, else the newest bearer
// token a rank presented (the ranks' Register and operator calls carry it).
// It tracks the calls in flight, so that stopping cancels them and the relay
// waits for them before it goes.
//
// Thread-safety: guarded by the relay's mutex (given to the constructor);
// Forward() takes it, the *Locked methods require it.
#ifndef DYNMO_RELAY_CALL_FORWARDER_H_
#define DYNMO_RELAY_CALL_FORWARDER_H_

#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace dynmo::relay {

class CallForwarder {
 public:
  // Starts the upstream call on `ctx`; `done` receives its status.
  using StartCall = std::function<void(grpc::ClientContext* ctx,
                                       std::function<void(grpc::Status)> done)>;

  CallForwarder(absl::Mutex* mu, std::string token, absl::Duration rpc_timeout);

  // Forwards the call of `context` (refused with UNAVAILABLE once stopping).
  // `on_ok`, when set, runs without the lock after a successful answer came
  // back and before the rank sees it.
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    StartCall start,
                                    std::function<void()> on_ok = nullptr);

  // The credential for upstream calls and sessions.
  std::string UpstreamTokenLocked() const ABSL_SHARED_LOCKS_REQUIRED(*mu_);
  // Refuses new calls and cancels those in flight.
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_);
  // No call in flight.
  bool IdleLocked() const ABSL_SHARED_LOCKS_REQUIRED(*mu_) {
    return in_flight_.empty();
  }

 private:
  absl::Mutex* const mu_;
  const std::string token_;
  const absl::Duration rpc_timeout_;
  bool stopping_ ABSL_GUARDED_BY(*mu_) = false;
  std::string caller_token_ ABSL_GUARDED_BY(*mu_);
  absl::flat_hash_set<grpc::ClientContext*> in_flight_ ABSL_GUARDED_BY(*mu_);
};

// The StartCall of one method of a stub's callback interface:
// AsyncCall(stub->async(), &Stub::async::GetJob, request, response).
template <typename Async, typename Req, typename Resp>
CallForwarder::StartCall AsyncCall(
    Async* async,
    void (Async::*method)(grpc::ClientContext*, const Req*, Resp*,
                          std::function<void(grpc::Status)>),
    const Req* request, Resp* response) {
  return [async, method, request, response](grpc::ClientContext* ctx,
                                            std::function<void(grpc::Status)> done) {
    (async->*method)(ctx, request, response, std::move(done));
  };
}

}  // namespace dynmo::relay

#endif  // DYNMO_RELAY_CALL_FORWARDER_H_
