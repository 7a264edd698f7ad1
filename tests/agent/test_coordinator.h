// The embedded coordinator the agent tests run against: a given trigger,
// plans applied 6 iterations after they are decided, a 5 ms decision tick,
// optionally one-phase (in-band) commits. Returns null after a failed
// EXPECT when it cannot start.
#ifndef DYNMO_TESTS_AGENT_TEST_COORDINATOR_H_
#define DYNMO_TESTS_AGENT_TEST_COORDINATOR_H_

#include <memory>
#include <string>

#include "coordinator/service/embedded_coordinator.h"
#include "gtest/gtest.h"

namespace dynmo::agent {

inline std::unique_ptr<service::EmbeddedCoordinator> StartTestCoordinator(
    const std::string& trigger, bool in_band = false,
    const std::string& listen = "127.0.0.1:0") {
  service::ServerOptions o;
  o.listen = listen;
  o.coordinator.job.in_band_commit = in_band;
  o.coordinator.job.default_policy.trigger = service::ParseTrigger(trigger).value();
  o.coordinator.job.plan_lead_iterations = 6;
  o.coordinator.tick = absl::Milliseconds(5);
  auto c = service::EmbeddedCoordinator::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

}  // namespace dynmo::agent

#endif  // DYNMO_TESTS_AGENT_TEST_COORDINATOR_H_
