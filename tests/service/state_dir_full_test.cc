// A real full disk under the state dir: a 64 KiB tmpfs mounted in a mount
// namespace of a child process (unshare; a user namespace too when not
// root), filled up, then a coordinator's commits fail with ENOSPC. A
// refused commit is rolled back (the change is not in force, and never
// written by a later commit), logged (persist_failed), counted, shown in
// the job's note when no caller hears of it, and leaves no temp file.
// Skipped, with the kernel's reason, where namespaces or tmpfs mounts are
// forbidden.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/service/coordinator.h"
#include "coordinator/service/event_log.h"
#include "gtest/gtest.h"
#include "tests/service/job_state_fixture.h"
#include "tests/service/private_tmpfs.h"

namespace dynmo::service {
namespace {

// The scenario, in the child: returns the problems found, one a line.
std::string RunOnAFullDisk(const std::string& mnt) {
  std::vector<std::string> problems;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) problems.push_back(what);
  };
  std::ostringstream log;
  ConfigureEventLog(EventLogOptions{LogFormat::kLogfmt, LogLevel::kInfo, &log});
  const std::string state_dir = mnt + "/state";
  CoordinatorOptions o;
  o.state_dir = state_dir;
  o.tick = absl::Hours(1);  // this test ticks by hand
  o.job.default_policy.trigger = *ParseTrigger("every:1");
  o.job.plan_lead_iterations = 5;
  absl::StatusOr<std::unique_ptr<Coordinator>> c = Coordinator::Create(o);
  if (!c.ok()) return absl::StrCat("coordinator: ", c.status().message());
  std::shared_ptr<JobState> job;
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int r = 0; r < kStages; ++r) {
    dynmo::v1::RegisterResponse resp;
    auto j = (*c)->jobs().Register(Reg(r), &resp, "");
    if (!j.ok()) return absl::StrCat("register: ", j.status().message());
    job = *j;
    sinks.push_back(std::make_shared<RecordingSink>());
    check(job->Attach(r, resp.session_key(), sinks.back()).ok(), "attach");
    check(job->OnReport(r, Report(r, 0)).ok(), "report");
  }
  check(job->Persist().ok(), "the first commit, with room to spare");
  const std::string tmp = state_dir + "/jobs/job.pb.tmp";

  FillUp(mnt + "/filler");
  // An operator's change: refused with ENOSPC and not in force.
  dynmo::v1::Policy repack;
  repack.set_repack(true);
  const absl::StatusOr<dynmo::v1::Policy> set = job->SetPolicy(repack);
  check(!set.ok(), "SetPolicy succeeded on a full disk");
  check(!set.ok() && set.status().message().find("No space left on device") != std::string::npos,
        absl::StrCat("SetPolicy's error does not say ENOSPC: ", set.status().ToString()));
  check(!job->Summary().policy().repack(), "the refused policy is in force");
  check(!std::filesystem::exists(tmp), "a temp file is left after the refused SetPolicy");
  // A plan the trigger wants: not issued (its epoch could not be made
  // durable); nobody called, so the job's note says why.
  (*c)->TickAll(absl::Now());
  const dynmo::v1::JobStatus st = job->Status();
  check(st.summary().epoch() == 0, absl::StrCat("epoch ", st.summary().epoch(), " issued"));
  check(st.summary().plan_state() == "idle", "a plan is in flight");
  check(st.note().find("plan not issued: state not persisted") != std::string::npos &&
            st.note().find("No space left on device") != std::string::npos,
        "the note does not say: " + st.note());
  for (const auto& s : sinks) check(s->Take().empty(), "a PREPARE left without its epoch durable");
  check(!std::filesystem::exists(tmp), "a temp file is left after the refused plan");
  check((*c)->keeper().failures() == 2,
        absl::StrCat((*c)->keeper().failures(), " failures counted, not 2"));
  const std::string text = log.str();
  check(text.find("level=error event=persist_failed error=\"state not persisted") !=
                std::string::npos &&
            text.find("No space left on device") != std::string::npos,
        "no persist_failed event with ENOSPC in:\n" + text);

  // Room again: the next commit (the plan) succeeds, and the refused policy
  // is not in what it wrote.
  std::filesystem::remove(mnt + "/filler");
  for (int r = 0; r < kStages; ++r) check(job->OnReport(r, Report(r, 1)).ok(), "report");
  (*c)->TickAll(absl::Now());
  check(job->Summary().epoch() == 1, "no plan issued once the disk had room");
  StateKeeper again(state_dir);
  absl::StatusOr<dynmo::v1::CoordinatorState> state = again.Open();
  check(state.ok() && state->jobs_size() == 1, "the state file does not read back");
  if (state.ok() && state->jobs_size() == 1) {
    check(state->jobs(0).epoch() == 1, "the plan's epoch is not durable");
    check(!state->jobs(0).policy().repack(), "the refused policy was written by a later commit");
  }
  (*c)->Stop();
  ConfigureEventLog(EventLogOptions{});
  return absl::StrJoin(problems, "\n");
}

TEST(StateDirFullTest, AnEnospcCommitIsRolledBackLoggedCountedNotedAndLeavesNoTempFile) {
  const std::string out = RunInPrivateTmpfs("64k", RunOnAFullDisk);
  if (out.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << "no private tmpfs here: " << out.substr(6);
  EXPECT_EQ(out, "OK");
}

}  // namespace
}  // namespace dynmo::service
