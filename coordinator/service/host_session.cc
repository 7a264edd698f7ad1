#include "coordinator/service/host_session.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job/session_sink.h"
#include "rpc/stream_outbox.h"
#include "coordinator/job/validation.h"
#include "coordinator/service/grpc_status.h"
#include "coordinator/service/raw_message.h"
#include "coordinator/service/refusal_log.h"

namespace dynmo::service {
namespace {

using dynmo::v1::CoordinatorMessage;
using dynmo::v1::HostCoordinatorMessage;
using dynmo::v1::HostMessage;

using RawReactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// The sink every rank of one host session shares; it queues encoded
// HostCoordinatorMessages (the stream is raw: raw_message.h).
class HostOutbox final : public SessionSink {
 public:
  HostOutbox(RawReactor* r, std::string host) : stream_(r), host_(std::move(host)) {}

  void SendTo(absl::Span<const int> ranks,
              std::shared_ptr<const CoordinatorMessage> message) override {
    HostCoordinatorMessage out;
    out.mutable_ranks()->Add(ranks.begin(), ranks.end());
    *out.mutable_message() = *message;
    stream_.Write(Encoded(out));
  }

  void Close(const absl::Status& status) override {
    stream_.Finish(ToGrpcStatus(status));
  }

  const std::string& host() const override { return host_; }

  rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer>& stream() { return stream_; }

 private:
  rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  const std::string host_;
};

class HostSessionReactor final : public RawReactor {
 public:
  HostSessionReactor(Coordinator* coordinator, std::string principal,
                     PendingSessions* pending, const std::string& peer)
      : coordinator_(coordinator), principal_(std::move(principal)),
        before_hello_(std::make_shared<PreHelloStream>(this)) {
    absl::StatusOr<std::shared_ptr<PendingSessions::Wait>> wait = pending->Admit(
        peer, [stream = before_hello_] { stream->Finish(NoHello()); });
    if (!wait.ok()) {
      coordinator_->metrics().RpcError("HostSession", "RESOURCE_EXHAUSTED");
      RawReactor::Finish(ToGrpcStatus(wait.status()));
      return;
    }
    wait_ = *std::move(wait);
    StartRead(&raw_in_);
  }

  void OnReadDone(bool ok) override {
    // Before the hello: the deadline may have ended the stream already.
    if (job_ == nullptr && outbox_ == nullptr && !wait_->Greeted()) return;
    if (!ok) {
      // The agent closed its side or the connection broke.
      Finish(grpc::Status::OK);
      return;
    }
    in_.Clear();
    const grpc::Status decoded = Decode(raw_in_, &in_);
    absl::Status s = decoded.ok() ? Handle()
                                  : absl::InvalidArgumentError(decoded.error_message());
    if (!s.ok()) {
      coordinator_->metrics().RpcError(
          "HostSession", GrpcCodeName(static_cast<grpc::StatusCode>(s.code())));
      LogSessionRefusal("HostSession", job_ != nullptr ? job_->name() : in_.hello().job(),
                        -1, s);
      Finish(ToGrpcStatus(s));
      return;
    }
    // A superseded session was finished meanwhile: start nothing new.
    if (outbox_ == nullptr || !outbox_->stream().finishing()) StartRead(&raw_in_);
  }

  void OnWriteDone(bool ok) override { outbox_->stream().OnWriteDone(ok); }

  void OnDone() override {
    if (wait_ != nullptr) wait_->Gone();
    before_hello_->Detach();
    if (job_ != nullptr) job_->DetachHost(ranks_, outbox_.get());
    if (outbox_ != nullptr) outbox_->stream().Detach();
    delete this;
  }

 private:
  void Finish(const grpc::Status& status) {
    if (outbox_ != nullptr) {
      outbox_->stream().Finish(status);  // after the write in flight
    } else {
      RawReactor::Finish(status);
    }
  }

  absl::Status Handle() {
    if (job_ == nullptr) return Hello();
    switch (in_.kind_case()) {
      case HostMessage::kBatch:
        for (const auto& m : in_.batch().messages()) {
          if (!carried_.contains(m.rank())) {
            return absl::InvalidArgumentError(absl::StrCat(
                "rank ", m.rank(), " is not carried by this host session of '",
                outbox_->host(), "' (", ranks_.size(), " ranks)"));
          }
        }
        return job_->OnHostBatch(in_.batch());
      case HostMessage::kHello:
        return absl::InvalidArgumentError("hello sent twice on one host session");
      default:
        return absl::InvalidArgumentError("empty HostSession message");
    }
  }

  absl::Status Hello() {
    if (!in_.has_hello()) {
      return absl::InvalidArgumentError(
          "the first HostSession message must be hello{job, host, ranks}");
    }
    const dynmo::v1::HostHello& hello = in_.hello();
    if (absl::Status s = ValidateHostHello(hello); !s.ok()) return s;
    absl::StatusOr<std::shared_ptr<JobState>> job =
        coordinator_->jobs().FindFor(hello.job(), principal_);
    if (!job.ok()) return job.status();
    std::vector<int> ranks(hello.ranks().begin(), hello.ranks().end());
    auto outbox = std::make_shared<HostOutbox>(this, hello.host());
    // Installed before attaching: once attached, the job may write to it.
    outbox_ = outbox;
    const std::vector<std::string> keys(hello.session_keys().begin(),
                                        hello.session_keys().end());
    if (absl::Status s = (*job)->AttachHost(ranks, keys, outbox); !s.ok()) return s;
    job_ = *job;
    ranks_ = std::move(ranks);
    carried_.insert(ranks_.begin(), ranks_.end());
    return absl::OkStatus();
  }

  // What the hello deadline ends the stream through: it outlives the
  // reactor, and is detached when the stream is done.
  using PreHelloStream = rpc::StreamOutbox<grpc::ByteBuffer, grpc::ByteBuffer>;

  Coordinator* coordinator_;
  const std::string principal_;  // named caller, or empty
  std::shared_ptr<PreHelloStream> before_hello_;
  std::shared_ptr<PendingSessions::Wait> wait_;  // until the hello
  std::shared_ptr<HostOutbox> outbox_;
  std::shared_ptr<JobState> job_;
  std::vector<int> ranks_;
  absl::flat_hash_set<int> carried_;
  grpc::ByteBuffer raw_in_;
  HostMessage in_;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewHostSessionReactor(
    Coordinator* coordinator, std::string principal, PendingSessions* pending,
    const std::string& peer) {
  return new HostSessionReactor(coordinator, std::move(principal), pending, peer);
}

grpc::Status NoHello() {
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      "no hello within the coordinator's --hello_timeout_s: a session must "
                      "name its job and rank first");
}

void LogSessionRefusal(absl::string_view rpc, absl::string_view job, int rank,
                       const absl::Status& why) {
  LogRefusal(LogLevel::kInfo, "session_refused",
             {{"rpc", rpc}, {"job", Bounded(job, 128)}, {"rank", rank},
              {"code", absl::StatusCodeToString(why.code())},
              {"reason", Bounded(why.message())}});
}

}  // namespace dynmo::service
