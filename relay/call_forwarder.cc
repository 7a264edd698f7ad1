#include "relay/call_forwarder.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "agent/channel.h"

namespace dynmo::relay {
namespace {

// The bearer token a caller presented, without the "Bearer " prefix.
std::string CallerToken(const grpc::CallbackServerContext& ctx) {
  auto it = ctx.client_metadata().find("authorization");
  if (it == ctx.client_metadata().end()) return "";
  std::string value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  return absl::StartsWith(value, kBearer) ? value.substr(kBearer.size()) : "";
}

}  // namespace

CallForwarder::CallForwarder(absl::Mutex* mu, std::string token,
                             absl::Duration rpc_timeout)
    : mu_(mu), token_(std::move(token)), rpc_timeout_(rpc_timeout) {}

grpc::ServerUnaryReactor* CallForwarder::Forward(grpc::CallbackServerContext* context,
                                                 StartCall start,
                                                 std::function<void()> on_ok) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto* call = new grpc::ClientContext;
  call->set_deadline(
      std::min(context->deadline(), absl::ToChronoTime(absl::Now() + rpc_timeout_)));
  call->set_wait_for_ready(true);
  {
    absl::MutexLock lock(mu_);
    if (stopping_) {
      delete call;
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "node relay is stopping"));
      return reactor;
    }
    if (token_.empty()) {
      if (std::string t = CallerToken(*context); !t.empty()) caller_token_ = t;
    }
    agent::AddBearerToken(call, UpstreamTokenLocked());
    in_flight_.insert(call);
  }
  start(call, [this, call, reactor, on_ok = std::move(on_ok)](grpc::Status s) {
    if (s.ok() && on_ok) on_ok();
    reactor->Finish(s);
    {
      absl::MutexLock lock(mu_);
      in_flight_.erase(call);
    }
    delete call;
  });
  return reactor;
}

std::string CallForwarder::UpstreamTokenLocked() const {
  return token_.empty() ? caller_token_ : token_;
}

void CallForwarder::StopLocked() {
  stopping_ = true;
  for (grpc::ClientContext* c : in_flight_) c->TryCancel();
}

}  // namespace dynmo::relay
