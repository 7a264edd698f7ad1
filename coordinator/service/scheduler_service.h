// SchedulerServiceImpl: dynmo.v1.SchedulerService over the ReleasedPool.
// Every call checks the bearer token first, then its arguments, then does
// one pool operation. WatchReleased is on the callback API
// (released_watchers.h): no thread per watcher, at most `max_watchers` at
// once (RESOURCE_EXHAUSTED beyond), ended when the client cancels or the
// server stops. The other calls are synchronous.
#ifndef DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_
#define DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_

#include "coordinator/service/auth.h"
#include "coordinator/service/coordinator.h"
#include "coordinator/service/released_watchers.h"
#include "dynmo/v1/scheduler.grpc.pb.h"

namespace dynmo::service {

class SchedulerServiceImpl final
    : public dynmo::v1::SchedulerService::WithCallbackMethod_WatchReleased<
          dynmo::v1::SchedulerService::Service> {
 public:
  SchedulerServiceImpl(Coordinator* coordinator, const Authenticator* auth,
                       int max_watchers)
      : coordinator_(coordinator), auth_(auth),
        watchers_(&coordinator->pool(), max_watchers) {}

  grpc::Status ListReleased(grpc::ServerContext* context,
                            const dynmo::v1::ListReleasedRequest* request,
                            dynmo::v1::ListReleasedResponse* response) override;
  grpc::ServerWriteReactor<dynmo::v1::ReleasedEvent>* WatchReleased(
      grpc::CallbackServerContext* context,
      const dynmo::v1::WatchReleasedRequest* request) override;
  grpc::Status Claim(grpc::ServerContext* context,
                     const dynmo::v1::ClaimRequest* request,
                     dynmo::v1::ClaimResponse* response) override;
  grpc::Status Return(grpc::ServerContext* context,
                      const dynmo::v1::ReturnRequest* request,
                      dynmo::v1::ReturnResponse* response) override;

  grpc::Status ListPlacements(grpc::ServerContext* context,
                              const dynmo::v1::ListPlacementsRequest* request,
                              dynmo::v1::ListPlacementsResponse* response) override;

  // Ends every WatchReleased (before server shutdown).
  void Stop() { watchers_.Stop(); }
  // WatchReleased streams open now.
  int watchers() const { return watchers_.open(); }

 private:
  grpc::Status Done(const char* method, const grpc::Status& status);

  Coordinator* coordinator_;
  const Authenticator* auth_;
  ReleasedWatchers watchers_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_
