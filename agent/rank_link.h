// RankLink: the link of one or more ranks of a job to the coordinator, the
// engine under Agent (one rank) and HostAgent (several). It holds each rank's
// protocol state (RankState, rank_state.h) behind ONE lock, and a background
// thread that registers the ranks, opens the stream that carries them
// (rpc::ClientStream) and, when the stream breaks, does both again after a
// backoff (ReconnectLoop, reconnect_loop.h) — re-registering every rank with
// its applied epoch, layout and held plan — unless the coordinator refused
// the registration for good (IsPermanentRefusal): then the link stops and
// every rank's stats() says gave_up and why.
//
// What differs between Agent and HostAgent is only the Wire: which unary call
// registers the ranks (Register, RegisterHost) and which stream carries them
// (Session, HostSession), i.e. how queued reports and acks become writes and
// how a plan message read reaches its ranks. A Wire's stream derives from
// RankLink::Stream, which ties the stream's life to the link: connected from
// its hello on, forgotten (and the error recorded) when it ends.
//
// The per-rank calls (index = position in the ranks given to the
// constructor) are HostedRank's (hosted_rank.h), which takes this lock and
// calls the rank's state itself: reporting never blocks on the network
// (bounded queues, oldest dropped), and each call that may queue a message
// starts a write at once.
//
// Thread-safe: any thread may call any method. The Wire's hooks run on the
// link's thread or gRPC's callback threads; those named *Locked with the
// link's lock held.
#ifndef DYNMO_AGENT_RANK_LINK_H_
#define DYNMO_AGENT_RANK_LINK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/agent_config.h"
#include "agent/rank_state.h"
#include "dynmo/v1/plan.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "rpc/client_stream.h"

namespace dynmo::agent {

class RankLink {
 public:
  struct Options {
    std::string token;  // bearer token on the registration and the stream
    absl::Duration initial_backoff = absl::Milliseconds(50);
    absl::Duration max_backoff = absl::Seconds(5);
    absl::Duration rpc_timeout = absl::Seconds(5);  // the registration
  };

  template <typename Out, typename In>
  class Stream;

  // How the ranks reach the coordinator. Called on the link's thread, one
  // connection attempt at a time: PrepareLocked, Register, RegisteredLocked,
  // then NewStream.
  class Wire {
   public:
    virtual ~Wire() = default;
    // The call names errors are tagged with ("Register", "Session").
    virtual const char* register_name() const = 0;
    virtual const char* stream_name() const = 0;
    // Builds the registration of `ranks`.
    virtual void PrepareLocked(const std::vector<RankState>& ranks) = 0;
    // The blocking registration call, on `ctx` (deadline, token set).
    virtual grpc::Status Register(grpc::ClientContext* ctx) = 0;
    // Hands each rank its answer (OnRegistered) for the stream's hello.
    virtual void RegisteredLocked(std::vector<RankState>& ranks) = 0;
    // A stream for `link`, not started (the link sets its token, starts it).
    virtual rpc::ClientStreamBase* NewStream(RankLink* link) = 0;
  };

  RankLink(const std::vector<AgentConfig>& ranks, Options options,
           std::unique_ptr<Wire> wire);
  ~RankLink();  // Stop()
  RankLink(const RankLink&) = delete;
  RankLink& operator=(const RankLink&) = delete;

  // Starts the background thread; does not wait for the coordinator.
  void Start();
  // Stops the thread (cancelling the call in flight). Idempotent; the
  // per-rank calls stay valid (reports queue, nothing is sent).
  void Stop();

  size_t size() const { return size_; }
  // Blocks until a stream is open or `timeout` passes.
  bool WaitConnected(absl::Duration timeout) const;
  // Blocks until every ack `rank` queued is written (or lost with a broken
  // stream) or `timeout` passes; true when none is left.
  bool Flush(size_t rank, absl::Duration timeout) const;

 private:
  friend class HostedRank;  // the per-rank calls, under mu_

  // One connection: register, then the stream until it ends. True when the
  // stream was established (the backoff restarts).
  bool ServeOnce();
  void SetErrorLocked(const std::string& error) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OpenedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndedLocked(const rpc::ClientStreamBase* stream, const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::unique_ptr<Wire> wire_;  // used by the link's thread only
  const size_t size_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  // The call to cancel on Stop: the registration, then the stream.
  grpc::ClientContext* live_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  rpc::LiveStream<rpc::ClientStreamBase> live_{&mu_};
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
};

// The base of a Wire's stream: the link's lock guards it, its hello opens
// the link, its end closes it. A Wire implements NextLocked (queued messages
// into the next write), WrittenLocked (counting what went out) and
// OnMessage: under the link's lock (`this->mu_`) it hands a plan message to
// its ranks (RankState::HandleDown), then Pump()s, so the acks they queue go
// out at once.
template <typename Out, typename In>
class RankLink::Stream : public rpc::ClientStream<Out, In> {
 protected:
  using Open = typename rpc::ClientStream<Out, In>::Open;

  Stream(RankLink* link, Out hello, Open open)
      : rpc::ClientStream<Out, In>(&link->mu_, std::move(hello), std::move(open)),
        link_(link) {}

  std::vector<RankState>& ranks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(*this->mu_) {  // link_->mu_
    return link_->ranks_;
  }

 private:
  void OpenedLocked() final { link_->OpenedLocked(); }
  void EndedLocked(const grpc::Status& status) final {
    link_->EndedLocked(this, status);
  }

  RankLink* const link_;
};

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_RANK_LINK_H_
