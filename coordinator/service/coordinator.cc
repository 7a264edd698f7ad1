#include "coordinator/service/coordinator.h"

#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "coordinator/service/event_log.h"

namespace dynmo::service {

Coordinator::Coordinator(const CoordinatorOptions& options)
    : options_(options),
      keeper_(options.state_dir),
      pool_(&keeper_),
      registry_(options.job, JobDeps{&keeper_, &pool_, &metrics_},
                JobLimits{options.max_jobs, options.max_jobs_per_principal,
                          options.max_ranks_per_job, options.max_layers,
                          options.max_replica_layers}) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorOptions& options) {
  std::unique_ptr<Coordinator> c(new Coordinator(options));
  c->keeper_.SetFailureHook(
      [m = &c->metrics_](const absl::Status&) { m->StateCommitFailed(); });
  // One line per change of mode, not one per refused commit.
  c->keeper_.SetModeHook([p = c.get()](bool writable, const absl::Status& why) {
    if (writable) {
      LogEvent(LogLevel::kInfo, "state_writable", {{"state_dir", p->options_.state_dir}});
    } else {
      LogEvent(LogLevel::kError, "persist_failed",
               {{"error", why.message()}, {"mode", "read-only"},
                {"state_dir", p->options_.state_dir}});
    }
    p->NotifyWritable(writable);
  });
  absl::StatusOr<dynmo::v1::CoordinatorState> state = c->keeper_.Open();
  if (!state.ok()) return state.status();
  c->pool_.Restore(*state);
  c->registry_.Restore(*state, c->keeper_.bad_records());
  // Re-save at once: a plan that was PREPARING at the crash is now aborted,
  // and that must be durable before any rank hears from us. A state dir
  // that takes no writes leaves the coordinator read-only instead: the
  // ranks hear nothing that needed a commit, and the abort is written by
  // the first commit once it can be.
  for (const auto& job : c->registry_.All()) {
    if (c->keeper_.read_only()) break;
    if (absl::Status s = job->Persist(); !s.ok() && !c->keeper_.read_only()) return s;
  }
  c->thread_ = std::thread([p = c.get()] { p->Loop(); });
  return c;
}

Coordinator::~Coordinator() { Stop(); }

void Coordinator::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  pool_.WakeAll();
  if (thread_.joinable()) thread_.join();
}

void Coordinator::TickAll(absl::Time now) {
  for (const auto& job : registry_.All()) job->Tick(now);
}

void Coordinator::SetWritableListener(std::function<void(bool)> listener) {
  {
    absl::MutexLock lock(&listener_mu_);
    writable_listener_ = std::move(listener);
  }
  NotifyWritable(!keeper_.read_only());
}

void Coordinator::NotifyWritable(bool writable) {
  absl::MutexLock lock(&listener_mu_);
  if (writable_listener_) writable_listener_(writable);
}

void Coordinator::Loop() {
  absl::Time next_expiry = absl::Now();
  absl::Time next_probe = absl::Now();
  absl::Time next_trim = absl::Now();
  while (!stop_.WaitForNotificationWithTimeout(options_.tick)) {
    const absl::Time now = absl::Now();
    if (now >= next_probe && keeper_.read_only()) {
      keeper_.Probe().IgnoreError();  // the mode hook logs a recovery
      next_probe = now + options_.probe_interval;
    }
    TickAll(now);
    if (options_.job_expiry != absl::InfiniteDuration() && now >= next_expiry) {
      for (const std::string& name : registry_.ExpireIdle(now, options_.job_expiry)) {
        LogEvent(LogLevel::kInfo, "job_expired",
                 {{"job", name}, {"idle", absl::FormatDuration(options_.job_expiry)}});
      }
      next_expiry = now + absl::Seconds(1);
    }
#if defined(__GLIBC__)
    // Memory that clients held (streams that never read, sessions that never
    // said hello) goes back to the system once they are gone: glibc keeps
    // freed pages in its arenas otherwise (docs/operations.md has figures).
    if (now >= next_trim) {
      malloc_trim(0);
      next_trim = now + absl::Seconds(10);
    }
#endif
  }
}

}  // namespace dynmo::service
