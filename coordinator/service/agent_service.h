// AgentServiceImpl: the dynmo.v1.AgentService over the Coordinator, on the
// gRPC callback API so that thousands of open Session streams cost no
// threads. Register validates and registers one rank. Session: the first
// message must be `hello` naming a registered rank; then reports and acks
// flow up and plan messages down. A malformed message ends the stream with
// INVALID_ARGUMENT (or the job's FAILED_PRECONDITION / NOT_FOUND) and leaves
// the job unchanged; the agent reconnects. RegisterHost / HostSession are the
// multiplexed variants for a process serving several ranks of one job
// (host_session.h). A Session or HostSession must say hello within the
// limits' deadline, and streams still waiting for theirs are capped per
// peer and in all (pending_sessions.h). With an agent token configured
// (server.h) every RPC must carry it.
#ifndef DYNMO_COORDINATOR_SERVICE_AGENT_SERVICE_H_
#define DYNMO_COORDINATOR_SERVICE_AGENT_SERVICE_H_

#include "coordinator/service/auth.h"
#include "coordinator/service/coordinator.h"
#include "coordinator/service/pending_sessions.h"
#include "dynmo/v1/agent.grpc.pb.h"

namespace dynmo::service {

// Every method is raw: the service decodes the bytes itself
// (raw_message.h), so a request or stream message that does not decode is
// INVALID_ARGUMENT (gRPC's own decoding answers UNIMPLEMENTED on a unary
// callback method and ends a stream with OK).
class AgentServiceImpl final
    : public dynmo::v1::AgentService::WithRawCallbackMethod_Register<
          dynmo::v1::AgentService::WithRawCallbackMethod_RegisterHost<
              dynmo::v1::AgentService::WithRawCallbackMethod_Session<
                  dynmo::v1::AgentService::WithRawCallbackMethod_HostSession<
                      dynmo::v1::AgentService::Service>>>> {
 public:
  // `auth` (not owned) gates every RPC: a call without the agents' bearer
  // token ends UNAUTHENTICATED before it touches any job.
  AgentServiceImpl(Coordinator* coordinator, const Authenticator* auth,
                   PendingLimits pending = {})
      : coordinator_(coordinator), auth_(auth),
        pending_(pending, [m = &coordinator->metrics()] { m->SessionWithoutHello(); }) {}

  // Streams waiting for their hello now.
  int pending_sessions() const { return pending_.pending(); }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* context) override;

  grpc::ServerUnaryReactor* RegisterHost(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* HostSession(
      grpc::CallbackServerContext* context) override;

 private:
  // `status`, counted in the RPC error metric when it is not OK.
  grpc::Status Done(const char* method, const grpc::Status& status);
  // A registration through ServeAdmittedRawUnary (agent_service.cc).
  template <typename Request, typename Response, typename Join>
  grpc::ServerUnaryReactor* ServeRegistration(const char* method,
                                              grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response, Join join);

  Coordinator* coordinator_;
  const Authenticator* auth_;
  PendingSessions pending_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_AGENT_SERVICE_H_
