#include "coordinator/service/coordinator.h"

namespace dynmo::service {

Coordinator::Coordinator(const CoordinatorOptions& options)
    : options_(options),
      keeper_(options.state_dir),
      pool_(&keeper_),
      registry_(options.job, JobDeps{&keeper_, &pool_, &metrics_},
                options.max_jobs) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorOptions& options) {
  std::unique_ptr<Coordinator> c(new Coordinator(options));
  absl::StatusOr<dynmo::v1::CoordinatorState> state = c->keeper_.Open();
  if (!state.ok()) return state.status();
  c->pool_.Restore(*state);
  c->registry_.Restore(*state);
  // Re-save at once: a plan that was PREPARING at the crash is now aborted,
  // and that must be durable before any rank hears from us.
  for (const auto& job : c->registry_.All()) {
    if (absl::Status s = job->Persist(); !s.ok()) return s;
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

void Coordinator::Loop() {
  while (!stop_.WaitForNotificationWithTimeout(options_.tick)) {
    TickAll(absl::Now());
  }
}

}  // namespace dynmo::service
