// A coordinator whose state dir takes no writes — a full disk, a read-only
// mount — but holds an intact snapshot starts anyway, read-only: its jobs
// are served and listed, every write is refused with UNAVAILABLE, the mode
// is logged once (not once per refusal), the health service says
// "dynmo.state" NOT_SERVING, and it takes writes again once the disk does
// (issue 25 item 4). Run in a child with a private tmpfs
// (private_tmpfs.h); skipped where namespaces or mounts are forbidden.
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "coordinator/service/coordinator.h"
#include "coordinator/service/event_log.h"
#include "coordinator/service/server.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"
#include "tests/service/private_tmpfs.h"

namespace dynmo::service {
namespace {

enum class Disk { kFull, kReadOnly };

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

dynmo::v1::RegisterRequest Named(const std::string& job, int rank) {
  dynmo::v1::RegisterRequest r = Reg(rank);
  r.set_job(job);
  return r;
}

// grpc.health.v1.Health/Check for `service`: the status number, or -1.
int Health(const std::string& address, const std::string& service) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  std::string request;
  if (!service.empty()) request = absl::StrCat("\x0a", std::string(1, static_cast<char>(service.size())), service);
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  std::vector<grpc::Slice> slices;
  if (!status.ok() || !resp.Dump(&slices).ok() || slices.empty()) return -1;
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out.size() == 2 && out[0] == '\x08' ? out[1] : -1;
}

std::string ReadOnlyScenario(const std::string& mnt, Disk disk) {
  std::vector<std::string> problems;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) problems.push_back(what);
  };
  std::ostringstream log;
  ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kInfo, &log});
  CoordinatorOptions o;
  o.state_dir = mnt + "/state";
  o.tick = absl::Hours(1);  // this test probes by hand
  {
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(o);
    if (!c.ok()) return absl::StrCat("first start: ", c.status().message());
    dynmo::v1::RegisterResponse resp;
    if (!(*c)->jobs().Register(Named("kept", 0), &resp, "alice").ok()) return "register";
  }
  if (disk == Disk::kFull) {
    FillUp(mnt + "/filler");
  } else if (!RemountReadOnly(mnt, true)) {
    return absl::StrCat("remount read-only: ", std::strerror(errno));
  }

  // The restart: it serves, read-only.
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(o);
  if (!c.ok()) return absl::StrCat("the restart failed: ", c.status().ToString());
  Coordinator& coordinator = **c;
  check(coordinator.keeper().read_only(), "not in read-only mode");
  check(coordinator.jobs().All().size() == 1, "the saved job is not served");
  check(coordinator.jobs().Find("kept").ok(), "the saved job cannot be found");
  dynmo::v1::RegisterResponse resp;
  check(coordinator.jobs().Register(Named("kept", 1), &resp, "alice").ok(),
        "a rank of a saved job cannot register");
  check(coordinator.jobs().Register(Named("kept", 2), &resp, "bob").status().code() ==
            absl::StatusCode::kPermissionDenied,
        "another principal got into the saved job");
  const absl::Status created = coordinator.jobs().Register(Named("new", 0), &resp, "alice").status();
  check(created.code() == absl::StatusCode::kUnavailable,
        "a new job was not refused with UNAVAILABLE: " + created.ToString());
  check(coordinator.jobs().All().size() == 1, "a job that could not be saved exists");
  dynmo::v1::Policy repack;
  repack.set_repack(true);
  const absl::StatusOr<dynmo::v1::Policy> set =
      (*coordinator.jobs().Find("kept"))->SetPolicy(repack);
  check(set.status().code() == absl::StatusCode::kUnavailable,
        "SetPolicy was not refused with UNAVAILABLE: " + set.status().ToString());
  check(coordinator.keeper().Probe().code() == absl::StatusCode::kUnavailable,
        "a probe of a disk still unwritable succeeded");
  const std::string text = log.str();
  check(Count(text, "event=persist_failed") == 1,
        absl::StrCat(Count(text, "event=persist_failed"), " persist_failed lines, not 1:\n", text));
  check(Count(text, "mode=read-only") == 1, "the mode is not logged once:\n" + text);

  // Room again: the next probe ends the mode, once.
  if (disk == Disk::kFull) {
    std::filesystem::remove(mnt + "/filler");
  } else if (!RemountReadOnly(mnt, false)) {
    return absl::StrCat("remount writable: ", std::strerror(errno));
  }
  check(coordinator.keeper().Probe().ok(), "the probe failed with room on the disk");
  check(!coordinator.keeper().read_only(), "still read-only");
  check(Count(log.str(), "event=state_writable") == 1, "no state_writable line:\n" + log.str());
  check(coordinator.jobs().Register(Named("new", 0), &resp, "alice").ok(),
        "a new job is refused after the recovery");
  coordinator.Stop();
  StateKeeper again(o.state_dir);
  absl::StatusOr<dynmo::v1::CoordinatorState> state = again.Open();
  check(state.ok() && state->jobs_size() == 2, "the state file does not hold both jobs");
  ConfigureEventLog(EventLogOptions{});
  return absl::StrJoin(problems, "\n");
}

// The server on a read-only state dir: "" SERVING (reads are served),
// "dynmo.state" NOT_SERVING, SERVING again once the disk takes writes.
std::string HealthScenario(const std::string& mnt) {
  std::vector<std::string> problems;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) problems.push_back(what);
  };
  ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kError, nullptr});
  ServerOptions o;
  o.coordinator.state_dir = mnt + "/state";
  o.coordinator.tick = absl::Hours(1);  // this test probes by hand
  {
    absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(o.coordinator);
    if (!c.ok()) return absl::StrCat("first start: ", c.status().message());
    dynmo::v1::RegisterResponse resp;
    if (!(*c)->jobs().Register(Named("kept", 0), &resp, "").ok()) return "register";
  }
  if (!RemountReadOnly(mnt, true)) return absl::StrCat("remount: ", std::strerror(errno));
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(o);
  if (!server.ok()) return absl::StrCat("the server did not start: ", server.status().ToString());
  check(Health((*server)->address(), "") == 1, "the server is not SERVING");
  check(Health((*server)->address(), "dynmo.state") == 2, "dynmo.state is not NOT_SERVING");
  if (!RemountReadOnly(mnt, false)) return absl::StrCat("remount: ", std::strerror(errno));
  // What the decision thread does every --probe_interval, by hand.
  check((*server)->coordinator().keeper().Probe().ok(), "the probe failed");
  check(Health((*server)->address(), "dynmo.state") == 1, "dynmo.state is not SERVING again");
  (*server)->Shutdown();
  return absl::StrJoin(problems, "\n");
}

void Expect(const std::string& out) {
  if (out.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << "no private tmpfs here: " << out.substr(6);
  EXPECT_EQ(out, "OK");
}

TEST(StateDirReadOnlyTest, OnAFullDiskItStartsReadOnlyAndRecovers) {
  Expect(RunInPrivateTmpfs("64k", [](const std::string& mnt) {
    return ReadOnlyScenario(mnt, Disk::kFull);
  }));
}

TEST(StateDirReadOnlyTest, OnAReadOnlyMountItStartsReadOnlyAndRecovers) {
  Expect(RunInPrivateTmpfs("1m", [](const std::string& mnt) {
    return ReadOnlyScenario(mnt, Disk::kReadOnly);
  }));
}

TEST(StateDirReadOnlyTest, HealthSaysTheStateIsNotServingWhileReadOnly) {
  Expect(RunInPrivateTmpfs("1m", HealthScenario));
}

}  // namespace
}  // namespace dynmo::service
