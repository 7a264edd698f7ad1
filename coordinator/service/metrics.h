// CoordinatorMetrics: the Prometheus metrics of one coordinator, on one
// prometheus::Registry that an Exposer serves at /metrics. Per-job series
// (label `job`) are created when a job first registers: stage loads
// (dynmo_stage_load_seconds{job,stage}), imbalance, bottleneck and its lower
// bound, predicted bubble ratio, plans by outcome, migrated bytes, GPUs by
// state, reports. Process-wide: RPC errors by method and code, and the
// decision latency histogram. prometheus-cpp metrics are thread-safe, so the
// handles may be used without the coordinator's locks.
#ifndef DYNMO_COORDINATOR_SERVICE_METRICS_H_
#define DYNMO_COORDINATOR_SERVICE_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dynmo::service {

class CoordinatorMetrics;

// The series of one job; they leave /metrics when it is destroyed (the job
// was deleted). Thread-safe.
class JobMetrics {
 public:
  JobMetrics(CoordinatorMetrics* owner, const std::string& job);
  ~JobMetrics();
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // Loads of the active stages; `stages` are their original stage ids.
  void SetStageLoads(absl::Span<const int> stages,
                     absl::Span<const double> loads);
  void SetMeasures(double imbalance, double bottleneck_s, double lower_bound_s,
                   double bubble_ratio);
  void SetGpus(int active, int released);
  // Each rank's relative speed (index = rank; core/rank_speed.h).
  void SetRankSpeeds(absl::Span<const double> speeds);
  void PlanIssued() { issued_->Increment(); }
  void PlanApplied() { applied_->Increment(); }
  void PlanAborted() { aborted_->Increment(); }
  void Migrated(double bytes) { migrated_->Increment(bytes); }
  void Report() { reports_->Increment(); }
  // A plan's predicted and realized gain (plan_lifecycle.h): the newest
  // plan's in two gauges, the error in the coordinator's histogram unless
  // the measurement held a model change.
  void PlanGain(double predicted, double realized, bool model_changed);

 private:
  CoordinatorMetrics* owner_;
  std::string job_;
  absl::Mutex mu_;
  std::map<int, prometheus::Gauge*> stage_loads_ ABSL_GUARDED_BY(mu_);
  std::map<int, prometheus::Gauge*> rank_speeds_ ABSL_GUARDED_BY(mu_);
  prometheus::Gauge* imbalance_;
  prometheus::Gauge* bottleneck_;
  prometheus::Gauge* lower_bound_;
  prometheus::Gauge* bubble_;
  prometheus::Gauge* gpus_active_;
  prometheus::Gauge* gpus_released_;
  prometheus::Counter* issued_;
  prometheus::Counter* applied_;
  prometheus::Counter* aborted_;
  prometheus::Counter* migrated_;
  prometheus::Counter* reports_;
  prometheus::Gauge* predicted_gain_;
  prometheus::Gauge* realized_gain_;
};

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  std::unique_ptr<JobMetrics> ForJob(const std::string& job) {
    return std::make_unique<JobMetrics>(this, job);
  }
  // Counts a failed RPC; `code` is the grpc::StatusCode name.
  void RpcError(const std::string& method, const std::string& code);
  void DecisionLatency(double seconds) { decision_latency_->Observe(seconds); }
  // Counts a commit of the state dir that failed (nothing was persisted).
  void StateCommitFailed() { state_commit_failures_->Increment(); }
  // A WatchReleased stream ended because its reader fell a whole backlog
  // behind; a Session or HostSession ended without its hello in time.
  void WatcherFellBehind() { watchers_fell_behind_->Increment(); }
  void SessionWithoutHello() { sessions_without_hello_->Increment(); }
  // Jobs quarantined now for an unusable record (job_registry.h).
  void SetQuarantinedJobs(int n) { quarantined_jobs_->Set(n); }

 private:
  friend class JobMetrics;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>* stage_load_;
  prometheus::Family<prometheus::Gauge>* rank_speed_;
  prometheus::Family<prometheus::Gauge>* imbalance_;
  prometheus::Family<prometheus::Gauge>* bottleneck_;
  prometheus::Family<prometheus::Gauge>* lower_bound_;
  prometheus::Family<prometheus::Gauge>* bubble_;
  prometheus::Family<prometheus::Gauge>* gpus_;
  prometheus::Family<prometheus::Counter>* plans_;
  prometheus::Family<prometheus::Counter>* migrated_;
  prometheus::Family<prometheus::Counter>* reports_;
  prometheus::Family<prometheus::Counter>* rpc_errors_;
  prometheus::Family<prometheus::Gauge>* predicted_gain_;
  prometheus::Family<prometheus::Gauge>* realized_gain_;
  prometheus::Histogram* prediction_error_;
  prometheus::Histogram* decision_latency_;
  prometheus::Counter* state_commit_failures_;
  prometheus::Gauge* quarantined_jobs_;
  prometheus::Counter* watchers_fell_behind_;
  prometheus::Counter* sessions_without_hello_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_METRICS_H_
