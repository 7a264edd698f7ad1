// The coordinator decides on what the ranks measured: dynmo-train ranks
// report to a real dynmo-coordinator daemon (loopback), and the job's view
// that `dynmo-ctl --json job` prints — per layer: times, resident and
// activation bytes, parameters; per stage: memory used and the cap the
// decisions use — is compared with what the ranks logged (--log_json). The
// daemon requires a bearer token of every caller, the ranks included.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/trainer/coordinator_daemon.h"
#include "tests/trainer/train_job.h"

namespace dynmo::trainer {
namespace {

// Protobuf's JSON prints 64-bit integers as strings.
int64_t Int(const nlohmann::json& v) {
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}

TEST(CoordinatorViewTest, TheCoordinatorSeesWhatTheRanksMeasured) {
  const std::string token_file = TempPath("view_token");
  std::ofstream(token_file) << "view-s3cret\n";
  CoordinatorDaemon daemon(FreePort(), {"--trigger=manual", "--token_file=" + token_file},
                           "--coordinator_token_file=" + token_file);
  ASSERT_TRUE(daemon.WaitReady()) << "dynmo-coordinator did not come up";
  const int microbatches = 4;
  JobResult r = RunJob(
      2, {"--layers=4", "--hidden=32", "--heads=4", "--seq_len=16",
          "--micro_batch=2", "--microbatches=4", "--steps=12", "--lr=0.01",
          "--seed=7", "--intra_op_threads=1", "--pp=2", "--memory_capacity_gb=2",
          "--coordinator=" + daemon.address(), "--job=view", "--trigger=manual",
          "--coordinator_token_file=" + token_file});
  ASSERT_TRUE(r.ok()) << r.AllLogs();
  ASSERT_EQ(r.records.size(), 12u);
  const std::string out = Capture(daemon.Ctl("--json job view"));
  const nlohmann::json view = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(view.is_discarded()) << out;
  ASSERT_EQ(view["layers"].size(), 6u) << out;

  const nlohmann::json& last = r.records.back();
  for (int l = 0; l < 6; ++l) {
    const nlohmann::json& c = view["layers"][l];
    SCOPED_TRACE(absl::StrCat("layer ", l, ": ", c.dump()));
    EXPECT_EQ(c["layer"].get<int>(), l);
    // Bytes and parameters are the same every iteration: exactly the rank's.
    EXPECT_EQ(Int(c["resident_bytes"]), last["layer_memory_bytes"][l].get<int64_t>());
    EXPECT_EQ(Int(c["activation_bytes"]), last["layer_activation_bytes"][l].get<int64_t>());
    EXPECT_EQ(Int(c["params"]), last["layer_params"][l].get<int64_t>());
    EXPECT_GT(Int(c["activation_bytes"]), 0);
    // Times are the coordinator's moving average of the reported samples (per
    // micro-batch; whichever arrived): inside the range the rank measured.
    double fwd_lo = 1e9, fwd_hi = 0, bwd_lo = 1e9, bwd_hi = 0, w_lo = 1e9, w_hi = 0;
    for (const nlohmann::json& rec : r.records) {
      const double fwd = rec["layer_forward_s"][l].get<double>() / microbatches;
      const double w = rec["layer_weight_grad_s"][l].get<double>() / microbatches;
      const double bwd = rec["layer_backward_s"][l].get<double>() / microbatches - w;
      fwd_lo = std::min(fwd_lo, fwd), fwd_hi = std::max(fwd_hi, fwd);
      bwd_lo = std::min(bwd_lo, bwd), bwd_hi = std::max(bwd_hi, bwd);
      w_lo = std::min(w_lo, w), w_hi = std::max(w_hi, w);
    }
    const double eps = 1e-12;
    EXPECT_GE(c["fwd_s"].get<double>(), fwd_lo - eps);
    EXPECT_LE(c["fwd_s"].get<double>(), fwd_hi + eps);
    EXPECT_GE(c["bwd_s"].get<double>(), bwd_lo - eps);
    EXPECT_LE(c["bwd_s"].get<double>(), bwd_hi + eps);
    EXPECT_GE(c["wgrad_s"].get<double>(), w_lo - eps);
    EXPECT_LE(c["wgrad_s"].get<double>(), w_hi + eps);
  }
  // The embedding has only a weight gradient; a block has both.
  EXPECT_GT(view["layers"][0]["wgrad_s"].get<double>(), 0);
  EXPECT_EQ(view["layers"][0]["bwd_s"].get<double>(), 0);
  EXPECT_GT(view["layers"][2]["bwd_s"].get<double>(), 0);
  EXPECT_GT(view["layers"][2]["wgrad_s"].get<double>(), 0);

  // Per stage: the measured memory of some reported iteration, and a cap of
  // at most the 2 GiB the ranks declared, less what the layer model cannot
  // explain of the measurement.
  ASSERT_EQ(view["stage_memory_used_bytes"].size(), 2u) << out;
  ASSERT_EQ(view["stage_memory_cap_bytes"].size(), 2u) << out;
  for (int s = 0; s < 2; ++s) {
    const int64_t used = Int(view["stage_memory_used_bytes"][s]);
    bool logged = false;
    for (const nlohmann::json& rec : r.records) {
      logged = logged || rec["stage_memory_bytes"][s].get<int64_t>() == used;
    }
    EXPECT_TRUE(logged) << "stage " << s << " used " << used;
    const int64_t cap = Int(view["stage_memory_cap_bytes"][s]);
    EXPECT_LE(cap, int64_t{2} << 30);
    EXPECT_GE(cap, (int64_t{2} << 30) - used);
  }
}

}  // namespace
}  // namespace dynmo::trainer
