// ClientStream<Out, In>: the client side of one bidi stream (an agent's
// Session, a host agent's or a node relay's HostSession), the client twin of
// StreamOutbox. The first write is the hello; after it one write is
// outstanding at a time, the next taken from the owner's queues by
// NextLocked() whenever Pump() finds the stream idle; every message read goes
// to OnMessage() until the stream ends.
//
// An owner subclasses it with the four hooks below and drives it through
// ClientStreamBase: Start() once, Pump() after queueing, Cancel() to end it;
// it deletes the stream once done() is true under its lock (OnDone has
// returned every use of the object by then), never while a LiveStream kick
// may still pump it.
//
// Thread-safety: the stream's flags are guarded by the OWNER's mutex, given
// to the constructor; the hooks whose name ends in Locked run with it held,
// OnMessage() without it (an owner that writes to other streams there must
// not hold its lock: gRPC may run reactions inline). Start(), Pump() and
// Cancel() may be called from any thread that does not hold that mutex.
#ifndef DYNMO_RPC_CLIENT_STREAM_H_
#define DYNMO_RPC_CLIENT_STREAM_H_

#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"
#include "grpcpp/support/status.h"

namespace dynmo::rpc {

// What an owner drives without knowing the stream's messages.
class ClientStreamBase {
 public:
  explicit ClientStreamBase(absl::Mutex* mu) : mu_(mu) {}
  virtual ~ClientStreamBase() = default;
  ClientStreamBase(const ClientStreamBase&) = delete;
  ClientStreamBase& operator=(const ClientStreamBase&) = delete;

  // The call's context: set its metadata (a bearer token) before Start().
  grpc::ClientContext* context() { return &ctx_; }
  // Starts the call and writes the hello; reactions may run before it returns.
  virtual void Start() = 0;
  // Starts the next write when none is outstanding and NextLocked() has one.
  virtual void Pump() = 0;
  void Cancel() { ctx_.TryCancel(); }

  // The hello was written: the stream is established.
  bool opened() const ABSL_SHARED_LOCKS_REQUIRED(*mu_) { return opened_; }
  // OnDone ran: the owner may delete the stream.
  bool done() const ABSL_SHARED_LOCKS_REQUIRED(*mu_) { return done_; }
  // Blocks until OnDone ran. Waits on the stream's own Notification, not on
  // the owner's mutex with a condition: a waiter there would put every unlock
  // of the owner's mutex (each report, ack and write completion) on absl's
  // slow path.
  void WaitDone() { finished_.WaitForNotification(); }

 protected:
  absl::Mutex* const mu_;
  grpc::ClientContext ctx_;
  bool writing_ ABSL_GUARDED_BY(*mu_) = true;  // the hello, from Start()
  bool broken_ ABSL_GUARDED_BY(*mu_) = false;  // a read or write failed
  bool opened_ ABSL_GUARDED_BY(*mu_) = false;
  bool done_ ABSL_GUARDED_BY(*mu_) = false;
  absl::Notification finished_;
};

template <typename Out, typename In>
class ClientStream : public ClientStreamBase,
                     public grpc::ClientBidiReactor<Out, In> {
 public:
  using Reactor = grpc::ClientBidiReactor<Out, In>;
  // Binds the reactor to its method: stub->async()->Session(ctx, reactor).
  using Open = std::function<void(grpc::ClientContext*, Reactor*)>;

  ClientStream(absl::Mutex* mu, Out hello, Open open)
      : ClientStreamBase(mu), open_(std::move(open)) {
    out_ = std::move(hello);
  }

  void Start() final {
    open_(&ctx_, this);
    this->StartRead(&in_);
    this->StartWrite(&out_);  // the hello; writing_ starts true
    this->StartCall();
  }

  void Pump() final {
    {
      absl::MutexLock lock(mu_);
      if (writing_ || broken_ || done_) return;
      out_.Clear();
      if (!NextLocked(&out_)) return;
      writing_ = true;
    }
    this->StartWrite(&out_);
  }

 protected:
  // Fills `out` (cleared) with the next message to write; false: none.
  virtual bool NextLocked(Out* out) = 0;
  // A write after the hello completed: `ok` false when it was lost with the
  // stream (OnDone follows).
  virtual void WrittenLocked(const Out& /*out*/, bool /*ok*/) {}
  // The hello was written.
  virtual void OpenedLocked() {}
  // One message read. Called WITHOUT the owner's mutex.
  virtual void OnMessage(const In& in) = 0;
  // The stream ended with `status`; the owner forgets it here.
  virtual void EndedLocked(const grpc::Status& status) = 0;

 private:
  void OnWriteDone(bool ok) final {
    {
      absl::MutexLock lock(mu_);
      writing_ = false;
      if (opened_) WrittenLocked(out_, ok);
      if (!ok) {
        broken_ = true;  // the stream is gone; OnDone follows
        return;
      }
      if (!opened_) {
        opened_ = true;
        OpenedLocked();
      }
    }
    Pump();
  }

  void OnReadDone(bool ok) final {
    if (!ok) {
      absl::MutexLock lock(mu_);
      broken_ = true;
      return;
    }
    OnMessage(in_);
    this->StartRead(&in_);
  }

  void OnDone(const grpc::Status& status) final {
    absl::MutexLock lock(mu_);
    done_ = true;
    EndedLocked(status);
    // Under the lock, so that an owner that sees done() may delete the
    // stream: nothing here touches it after the unlock.
    finished_.Notify();
  }

  Open open_;
  In in_;
  Out out_;
};

// The owner's live stream, pumped from any thread: Kick() pumps it outside
// the owner's lock (a pump may start a write, and gRPC may run reactions
// inline), counting the kicks in flight, so that the owner deletes no stream
// while kicked() — a stream's Pump() is a no-op once it is done.
//
// Thread-safety: guarded by the owner's mutex; Kick() takes it itself.
template <typename S>
class LiveStream {
 public:
  explicit LiveStream(absl::Mutex* mu) : mu_(mu) {}

  S* get() const ABSL_SHARED_LOCKS_REQUIRED(*mu_) { return live_; }
  void SetLocked(S* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) { live_ = stream; }
  // Forgets `stream` if it is the live one.
  void ForgetLocked(const ClientStreamBase* stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu_) {
    if (live_ == stream) live_ = nullptr;
  }
  bool kicked() const ABSL_SHARED_LOCKS_REQUIRED(*mu_) { return kicking_ > 0; }

  // Starts a write on the live stream, if any (call after queueing).
  void Kick() {
    S* s = nullptr;
    {
      absl::MutexLock lock(mu_);
      s = live_;
      if (s == nullptr) return;
      ++kicking_;  // not deleted while kicked
    }
    s->Pump();
    absl::MutexLock lock(mu_);
    --kicking_;
  }

 private:
  absl::Mutex* const mu_;
  S* live_ ABSL_GUARDED_BY(*mu_) = nullptr;
  int kicking_ ABSL_GUARDED_BY(*mu_) = 0;
};

}  // namespace dynmo::rpc

#endif  // DYNMO_RPC_CLIENT_STREAM_H_
