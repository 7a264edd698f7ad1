// Coordinator: the service's state without its transport. Owns the state
// keeper (crash-safe snapshot), the released pool, the job registry, the
// metrics and the decision thread that ticks every job (timeouts, measures,
// triggers). The gRPC services (agent_service.h, scheduler_service.h,
// operator_service.h) are thin adapters over it, and tests can drive it
// directly. Thread-safe. A state dir that takes no writes (full, read-only)
// leaves it serving read-only (state_store.h), not failing to start.
#ifndef DYNMO_COORDINATOR_SERVICE_COORDINATOR_H_
#define DYNMO_COORDINATOR_SERVICE_COORDINATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "coordinator/service/job_registry.h"
#include "coordinator/service/metrics.h"
#include "coordinator/service/released_pool.h"
#include "coordinator/service/state_store.h"

namespace dynmo::service {

struct CoordinatorOptions {
  std::string state_dir;  // empty: nothing survives a restart
  JobOptions job;
  int max_jobs = 1024;
  int max_jobs_per_principal = 64;  // per named principal (auth.h); 0: no cap
  // Bounds on one job's shape, with or without principals (JobLimits).
  int max_ranks_per_job = JobLimits{}.max_ranks_per_job;
  int max_layers = JobLimits{}.max_layers;
  int64_t max_replica_layers = JobLimits{}.max_replica_layers;
  absl::Duration tick = absl::Milliseconds(20);
  // A job with no connected rank and no activity for this long is deleted
  // (its record, its metric series); InfiniteDuration: never.
  absl::Duration job_expiry = absl::Hours(24);
  // In read-only mode (state_store.h) the decision thread tries the state
  // dir again this often.
  absl::Duration probe_interval = absl::Seconds(5);
};

class Coordinator {
 public:
  // Loads the state dir (if any) and starts the decision thread.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      const CoordinatorOptions& options);
  ~Coordinator();

  JobRegistry& jobs() { return registry_; }
  ReleasedPool& pool() { return pool_; }
  CoordinatorMetrics& metrics() { return metrics_; }
  StateKeeper& keeper() { return keeper_; }

  // Runs one decision round over every job now (tests; the thread does it
  // every `tick`).
  void TickAll(absl::Time now);
  // Stops the decision thread and wakes pool watchers. Idempotent.
  void Stop();

  // Called at once with whether the state dir takes writes, then at each
  // change (read-only mode, state_store.h): the server's health status.
  void SetWritableListener(std::function<void(bool)> listener);

 private:
  explicit Coordinator(const CoordinatorOptions& options);
  void Loop();
  void NotifyWritable(bool writable);

  const CoordinatorOptions options_;
  StateKeeper keeper_;
  CoordinatorMetrics metrics_;
  ReleasedPool pool_;
  JobRegistry registry_;
  absl::Mutex listener_mu_;
  std::function<void(bool)> writable_listener_ ABSL_GUARDED_BY(listener_mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_COORDINATOR_H_
