// SchedulerServiceImpl: dynmo.v1.SchedulerService over the ReleasedPool.
// Every call checks the bearer token first, then its arguments, then does
// one pool operation. WatchReleased holds one thread per watcher (there are
// few schedulers) and ends when the client cancels or the server stops.
#ifndef DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_
#define DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_

#include <atomic>

#include "coordinator/service/auth.h"
#include "coordinator/service/coordinator.h"
#include "dynmo/v1/scheduler.grpc.pb.h"

namespace dynmo::service {

class SchedulerServiceImpl final : public dynmo::v1::SchedulerService::Service {
 public:
  SchedulerServiceImpl(Coordinator* coordinator, const Authenticator* auth)
      : coordinator_(coordinator), auth_(auth) {}

  grpc::Status ListReleased(grpc::ServerContext* context,
                            const dynmo::v1::ListReleasedRequest* request,
                            dynmo::v1::ListReleasedResponse* response) override;
  grpc::Status WatchReleased(
      grpc::ServerContext* context,
      const dynmo::v1::WatchReleasedRequest* request,
      grpc::ServerWriter<dynmo::v1::ReleasedEvent>* writer) override;
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
  void Stop() { stopping_ = true; }

 private:
  grpc::Status Done(const char* method, const grpc::Status& status);

  Coordinator* coordinator_;
  const Authenticator* auth_;
  std::atomic<bool> stopping_{false};
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_SCHEDULER_SERVICE_H_
