// SchedulerServiceImpl: dynmo.v1.SchedulerService over the ReleasedPool.
// Every call checks the bearer token first, then its arguments, then does
// one pool operation. WatchReleased is on the callback API
// (released_watchers.h): no thread per watcher, at most `max_watchers` at
// once (RESOURCE_EXHAUSTED beyond), ended when the client cancels or the
// server stops. Every call takes its request as raw bytes on the callback
// API (raw_message.h: bytes that do not decode are INVALID_ARGUMENT); the
// unary ones are served inline: none waits on another.
// Thread-safe (the pool locks itself).
#ifndef DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_
#define DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_

#include "coordinator/service/auth.h"
#include "coordinator/service/coordinator.h"
#include "coordinator/service/released_watchers.h"
#include "dynmo/v1/scheduler.grpc.pb.h"

namespace dynmo::service {

class SchedulerServiceImpl final
    : public dynmo::v1::SchedulerService::WithRawCallbackMethod_WatchReleased<
          dynmo::v1::SchedulerService::WithRawCallbackMethod_ListReleased<
              dynmo::v1::SchedulerService::WithRawCallbackMethod_Claim<
                  dynmo::v1::SchedulerService::WithRawCallbackMethod_Return<
                      dynmo::v1::SchedulerService::WithRawCallbackMethod_ListPlacements<
                          dynmo::v1::SchedulerService::Service>>>>> {
 public:
  // `max_watchers` WatchReleased streams at once, each with at most
  // `backlog` waiting for its reader (released_watchers.h).
  SchedulerServiceImpl(Coordinator* coordinator, const Authenticator* auth,
                       int max_watchers, rpc::OutboxBound backlog = {})
      : coordinator_(coordinator), auth_(auth),
        watchers_(&coordinator->pool(), max_watchers, backlog,
                  [m = &coordinator->metrics()] { m->WatcherFellBehind(); }) {}

  grpc::ServerUnaryReactor* ListReleased(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchReleased(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Claim(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Return(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListPlacements(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;

  // Ends every WatchReleased (before server shutdown).
  void Stop() { watchers_.Stop(); }
  // WatchReleased streams open now.
  int watchers() const { return watchers_.open(); }

 private:
  // The unary methods, on decoded messages.
  grpc::Status ServeListReleased(const grpc::ServerContextBase& context,
                                 const dynmo::v1::ListReleasedRequest& request,
                                 dynmo::v1::ListReleasedResponse* response);
  grpc::Status ServeClaim(const grpc::ServerContextBase& context,
                          const dynmo::v1::ClaimRequest& request,
                          dynmo::v1::ClaimResponse* response);
  grpc::Status ServeReturn(const grpc::ServerContextBase& context,
                           const dynmo::v1::ReturnRequest& request,
                           dynmo::v1::ReturnResponse* response);
  grpc::Status ServeListPlacements(const grpc::ServerContextBase& context,
                                   const dynmo::v1::ListPlacementsRequest& request,
                                   dynmo::v1::ListPlacementsResponse* response);
  // Counts a failed call of `method` in /metrics; returns `status`.
  grpc::Status Done(const char* method, const grpc::Status& status);

  Coordinator* coordinator_;
  const Authenticator* auth_;
  ReleasedWatchers watchers_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_
