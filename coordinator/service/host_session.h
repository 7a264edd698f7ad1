// HostSession: the coordinator's side of one multiplexed stream carrying
// several ranks of one job (dynmo.v1.AgentService.HostSession).
//
// The first message must be a HostHello naming registered ranks; the ranks
// are bound to the stream all or nothing (JobState::AttachHost). Then each
// HostBatch is checked as a whole (every rank carried by this session, every
// report and ack valid) and applied in order under one job lock. Downstream,
// the stream is ONE SessionSink shared by its ranks, so JobState's
// broadcasts reach it as one HostCoordinatorMessage listing the ranks.
// Any error ends the stream with its status (INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, ALREADY_EXISTS) and leaves the job unchanged; the
// host agent reconnects. When the stream ends, its ranks are unbound (unless
// a newer session took them over).
//
// Thread-safety: gRPC serialises a reactor's reactions; the sink may be
// used from any thread.
#ifndef DYNMO_COORDINATOR_SERVICE_HOST_SESSION_H_
#define DYNMO_COORDINATOR_SERVICE_HOST_SESSION_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "coordinator/service/coordinator.h"
#include "coordinator/service/pending_sessions.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "grpcpp/support/server_callback.h"

namespace dynmo::service {

// A reactor that deletes itself when the stream is done. `principal`: the
// named caller (auth.h), or empty; a named caller may only attach ranks of
// its own jobs (PERMISSION_DENIED).
// The stream is raw (raw_message.h): a message that does not decode as a
// HostMessage ends it with INVALID_ARGUMENT.
// The stream waits for its hello in `pending` (pending_sessions.h): beyond
// its caps it ends at once with RESOURCE_EXHAUSTED, past its deadline with
// DEADLINE_EXCEEDED.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewHostSessionReactor(
    Coordinator* coordinator, std::string principal, PendingSessions* pending,
    const std::string& peer);

// The status a stream that never said hello ends with.
grpc::Status NoHello();

// The session_refused line of a Session or HostSession ended by `why`,
// bounded in size and rate (refusal_log.h).
void LogSessionRefusal(absl::string_view rpc, absl::string_view job, int rank,
                       const absl::Status& why);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_HOST_SESSION_H_
