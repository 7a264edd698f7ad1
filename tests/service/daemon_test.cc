// End-to-end tests of the shipped binaries (from DYNMO_BIN_DIR): the
// dynmo-coordinator daemon, dynmo-loadgen driving 8 real agents, dynmo-ctl.
// Covers re-packing that releases GPUs, kill -9 and restart from the state
// dir, and TLS / mutual TLS with the bearer token.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

std::string BinDir() {
  const char* d = std::getenv("DYNMO_BIN_DIR");
  return d != nullptr ? d : "";
}

std::string TempDir() {
  char tmpl[] = "/tmp/dynmo_daemon_XXXXXX";
  return mkdtemp(tmpl);
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

struct Result {
  int rc = -1;
  std::string out;
};

Result Shell(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// A child process we can kill -9.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = freopen(log.c_str(), "a", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Scripted imbalance: layer 0 dominates, the other 15 layers are light, so
// re-packing can run on two stages without losing throughput.
std::string WriteSkewedTrace(const std::string& dir, int records) {
  const std::string path = dir + "/skewed.jsonl";
  std::ofstream out(path);
  for (int k = 0; k < records; ++k) {
    nlohmann::json layers = nlohmann::json::array();
    for (int l = 0; l < 16; ++l) {
      const double t = l == 0 ? 0.050 : 0.001;
      layers.push_back({{"fwd", t}, {"bwd", t}, {"wgrad", t},
                        {"mem_bytes", 1 << 20}});
    }
    out << nlohmann::json{{"iter", k}, {"layers", layers}}.dump() << "\n";
  }
  return path;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = BinDir();
    if (bin_.empty()) GTEST_SKIP() << "DYNMO_BIN_DIR not set";
    dir_ = TempDir();
    port_ = FreePort();
    address_ = absl::StrCat("127.0.0.1:", port_);
  }
  void TearDown() override {
    StopDaemon(SIGTERM);
    if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_);
  }

  void StartDaemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {
        bin_ + "/dynmo-coordinator", "--listen=" + address_,
        "--state_dir=" + dir_ + "/state", "--trigger=every:5", "--repack",
        "--plan_lead_iterations=6"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = Spawn(argv, dir_ + "/coordinator.log");
    ASSERT_GT(pid_, 0);
  }

  void WaitReady(const std::string& ctl_flags = "") {
    for (int i = 0; i < 100; ++i) {
      if (Ctl("jobs", ctl_flags).rc == 0) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "coordinator not ready: " << Shell("cat " + dir_ + "/coordinator.log").out;
  }

  void StopDaemon(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int st;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  Result Ctl(const std::string& args, const std::string& flags = "") {
    return Shell(absl::StrCat(bin_, "/dynmo-ctl --coordinator=", address_, " ",
                            flags, " ", args));
  }

  nlohmann::json Json(const Result& r) {
    EXPECT_EQ(r.rc, 0) << r.out;
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  std::string Loadgen(const std::string& job, const std::string& source,
                      int iterations, const std::string& extra = "") {
    return absl::StrCat(bin_, "/dynmo-loadgen --coordinator=", address_,
                        " --job=", job, " --agents=8 --iterations=", iterations,
                        " --iteration_ms=10 --drain_s=0.5 ", source, " ", extra);
  }

  // kill -9 of the coordinator while a second job runs with `loadgen_flags`.
  void Kill9MidRun(const std::string& loadgen_flags);

  std::string bin_, dir_, address_;
  int port_ = 0;
  pid_t pid_ = -1;
};

TEST_F(DaemonTest, RepackingReleasesRanksThatCtlReleasedShows) {
  StartDaemon();
  WaitReady();
  const std::string trace = WriteSkewedTrace(dir_, 50);
  Result lg = Shell(Loadgen("skewed", "--trace=" + trace, 60));
  ASSERT_EQ(lg.rc, 0) << lg.out;
  nlohmann::json summary = nlohmann::json::parse(lg.out);
  ASSERT_GE(summary["plans_applied"].get<int>(), 1) << lg.out;
  const int active = static_cast<int>(summary["active_stages"].size());
  ASSERT_LT(active, 8) << lg.out;

  nlohmann::json released = Json(Ctl("released", "--json"));
  ASSERT_EQ(static_cast<int>(released["gpus"].size()), 8 - active)
      << released.dump(2);
  for (const auto& g : released["gpus"]) {
    EXPECT_EQ(g["job"], "skewed");
    EXPECT_EQ(g["state"], "FREE");
  }
  Result table = Ctl("released");
  EXPECT_EQ(table.rc, 0);
  EXPECT_NE(table.out.find("gpu-1"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("sim-host-0"), std::string::npos) << table.out;
  // The scheduler claims one and returns it.
  EXPECT_EQ(Ctl("claim gpu-1 --holder=batch --lease_seconds=60").rc, 0);
  EXPECT_EQ(Ctl("claim gpu-1 --holder=other").rc, 1) << "leased by batch";
  EXPECT_EQ(Ctl("return gpu-1 --holder=batch").rc, 0);
  // The agents are gone, so "decide now" is refused with the reason.
  Result reb = Ctl("rebalance skewed");
  EXPECT_EQ(reb.rc, 1);
  EXPECT_NE(reb.out.find("without a session"), std::string::npos) << reb.out;
  EXPECT_EQ(Ctl("rebalance nosuchjob").rc, 1);
  // The job's history names the re-packing plan.
  Result plans = Ctl("plans skewed");
  EXPECT_NE(plans.out.find("applied"), std::string::npos) << plans.out;
  EXPECT_NE(plans.out.find("repack"), std::string::npos) << plans.out;
  // The daemon's log has a line per plan event.
  const std::string log = Shell("cat " + dir_ + "/coordinator.log").out;
  for (const char* event : {" level=info event=plan_issued job=skewed epoch=1 ",
                            " level=info event=plan_committed job=skewed epoch=1\n",
                            " level=info event=plan_applied job=skewed epoch=1 ",
                            " level=info event=repack job=skewed "}) {
    EXPECT_NE(log.find(event), std::string::npos) << event << "\n" << log;
  }
}

// Every kind of decision in one scripted run, as --log_format=json lines on
// the daemon's stderr: each line one JSON object with ts, level and event,
// each event with its fields.
TEST_F(DaemonTest, EveryDecisionIsOneJsonEventLineWithItsFields) {
  std::ofstream(dir_ + "/token") << "t0ken\n";
  const std::string token = " --coordinator_token_file=" + dir_ + "/token";
  StartDaemon({"--log_format=json", "--token_file=" + dir_ + "/token"});
  WaitReady(token);
  const std::string trace = WriteSkewedTrace(dir_, 50);
  ASSERT_EQ(Shell(Loadgen("ev", "--trace=" + trace, 60) + token).rc, 0);
  ASSERT_EQ(Ctl("claim gpu-1 --holder=batch --lease_seconds=60", token).rc, 0);
  ASSERT_EQ(Ctl("claim gpu-1 --holder=other", token).rc, 1);
  ASSERT_EQ(Ctl("return gpu-1 --holder=batch", token).rc, 0);
  ASSERT_EQ(Ctl("jobs", "--timeout_s=2").rc, 1) << "no token";
  // The state dir refuses the job's next commit (a directory where its
  // record's temp file goes): the policy change is refused and logged.
  ASSERT_EQ(mkdir((dir_ + "/state/jobs/ev.pb.tmp").c_str(), 0755), 0);
  EXPECT_EQ(Ctl("policy ev --trigger=manual", token).rc, 1);
  ASSERT_EQ(rmdir((dir_ + "/state/jobs/ev.pb.tmp").c_str()), 0);
  ASSERT_EQ(Ctl("delete ev", token).rc, 0);
  StopDaemon(SIGTERM);

  std::ifstream in(dir_ + "/coordinator.log");
  std::map<std::string, std::vector<nlohmann::json>> events;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;  // gRPC's own log, if any
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    ASSERT_TRUE(j.contains("ts") && j.contains("level")) << line;
    events[j["event"].get<std::string>()].push_back(j);
  }
  // event -> level and the fields it must carry.
  const std::map<std::string, std::pair<std::string, std::vector<std::string>>> want = {
      {"listening", {"info", {"address", "port", "state_dir", "version"}}},
      {"job_created", {"info", {"job", "owner", "pp", "dp", "layers"}}},
      {"plan_issued", {"info", {"job", "epoch", "reason", "boundaries_from", "boundaries_to",
                                "stages", "apply_iteration", "migrations",
                                "migration_bytes", "prepare_ranks", "prepare_sessions",
                                "predicted_gain"}}},
      {"plan_committed", {"info", {"job", "epoch"}}},
      {"plan_applied", {"info", {"job", "epoch", "apply_iteration", "reason", "boundaries",
                                 "stages"}}},
      {"repack", {"info", {"job", "epoch", "stages", "gpus_released"}}},
      {"plan_realized", {"info", {"job", "epoch", "apply_iteration", "predicted_gain",
                                  "realized_gain", "error", "before_s", "after_s", "spread",
                                  "iterations_before", "iterations_after"}}},
      {"claim", {"info", {"gpus", "holder", "lease_s"}}},
      {"claim_refused", {"info", {"gpus", "holder", "reason"}}},
      {"return", {"info", {"gpus", "holder"}}},
      {"auth_refused", {"warning", {"role", "peer", "code", "reason"}}},
      {"persist_failed", {"error", {"error"}}},
      {"job_deleted", {"info", {"job", "sessions_ended", "forced"}}},
      {"shutdown", {"info", {"signal"}}},
  };
  for (const auto& [event, spec] : want) {
    ASSERT_FALSE(events[event].empty()) << event << " never logged";
    const nlohmann::json& j = events[event].front();
    EXPECT_EQ(j["level"], spec.first) << j.dump();
    for (const std::string& field : spec.second) {
      EXPECT_TRUE(j.contains(field)) << event << " without " << field << ": " << j.dump();
    }
  }
  EXPECT_EQ(events["job_created"].front()["job"], "ev");
  EXPECT_EQ(events["claim"].front()["gpus"], "gpu-1");
  EXPECT_EQ(events["claim"].front()["holder"], "batch");
  EXPECT_EQ(events["claim"].front()["lease_s"], 60);
  EXPECT_EQ(events["auth_refused"].front()["code"], "UNAUTHENTICATED");
  EXPECT_NE(events["persist_failed"].front()["error"].get<std::string>().find(
                "state not persisted"),
            std::string::npos);
  EXPECT_EQ(events["shutdown"].front()["signal"], SIGTERM);
  EXPECT_GT(events["repack"].front()["gpus_released"].get<int>(), 0);
  // Applied epochs only go up.
  uint64_t last = 0;
  for (const nlohmann::json& j : events["plan_applied"]) {
    EXPECT_GT(j["epoch"].get<uint64_t>(), last);
    last = j["epoch"].get<uint64_t>();
  }
}

TEST_F(DaemonTest, OneCoordinatorPerAddressAndPerStateDirAndNoBadFlags) {
  StartDaemon();
  WaitReady();
  const std::string bin = bin_ + "/dynmo-coordinator";
  // The same state dir on another port: refused, the running one untouched.
  Result same_dir = Shell(absl::StrCat("timeout 10 ", bin, " --listen=127.0.0.1:0 --state_dir=",
                                       dir_, "/state"));
  EXPECT_EQ(same_dir.rc, 1) << same_dir.out;
  EXPECT_NE(same_dir.out.find("in use by another dynmo-coordinator"), std::string::npos)
      << same_dir.out;
  // The same address with another state dir: cannot bind (no SO_REUSEPORT).
  Result same_port = Shell(absl::StrCat("timeout 10 ", bin, " --listen=", address_,
                                        " --state_dir=", dir_, "/other"));
  EXPECT_EQ(same_port.rc, 1) << same_port.out;
  // Out-of-range ports and numbers: one line, exit 2, nothing started.
  for (const std::string flags :
       {"--listen=127.0.0.1:99999", "--listen=nocolon", "--metrics_listen=:1",
        "--prepare_timeout_s=-1", "--prepare_timeout_s=nan", "--migration_bandwidth=0",
        "--auto_horizon_iterations=0", "--max_jobs=0", "--max_message_bytes=-5",
        "--iteration_window=0", "--epoch_window=-1", "--log_format=xml", "--log_level=loud",
        "--malloc_arenas=-1", "--malloc_arenas=5000"}) {
    Result r = Shell(absl::StrCat("timeout 10 ", bin, " --listen=127.0.0.1:0 ", flags));
    EXPECT_EQ(r.rc, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(" level=error event=bad_flag error="), std::string::npos)
        << flags << ": " << r.out;
  }
  // A file that is not a certificate: one clear line, no gRPC SSL log.
  std::ofstream(dir_ + "/junk.pem") << "not a certificate\n";
  Result junk = Shell(absl::StrCat("timeout 10 ", bin, " --listen=127.0.0.1:0 --tls_cert=",
                                   dir_, "/junk.pem --tls_key=", dir_, "/junk.pem"));
  EXPECT_NE(junk.rc, 0) << junk.out;
  EXPECT_NE(junk.out.find("TLS certificate " + dir_ + "/junk.pem holds no PEM block"),
            std::string::npos)
      << junk.out;
  EXPECT_EQ(std::count(junk.out.begin(), junk.out.end(), '\n'), 1) << junk.out;
  EXPECT_EQ(Ctl("jobs").rc, 0) << "the first coordinator still serves";
}

TEST_F(DaemonTest, CtlPolicyChangesOnlyTheFlagsGivenAndDeleteForgetsAJob) {
  StartDaemon();
  WaitReady();
  const std::string trace = WriteSkewedTrace(dir_, 10);
  ASSERT_EQ(Shell(Loadgen("pol", "--trace=" + trace, 10)).rc, 0);
  ASSERT_EQ(Ctl("policy pol --repack --repack_tolerance=0.25").rc, 0);
  Result r = Ctl("policy pol --trigger=manual");
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json job = Json(Ctl("job pol", "--json"));
  const nlohmann::json& policy = job["summary"]["policy"];
  EXPECT_EQ(policy["trigger"], "manual") << job.dump();
  EXPECT_EQ(policy["repack"], true) << "--trigger alone reset re-packing: " << job.dump();
  EXPECT_DOUBLE_EQ(policy["repack_tolerance"].get<double>(), 0.25) << job.dump();
  Result unknown = Ctl("policy nope --trigger=manual");
  EXPECT_NE(unknown.rc, 0);
  EXPECT_NE(unknown.out.find("nope"), std::string::npos) << unknown.out;
  // The loadgen's ranks are gone: the job can be deleted, and stays gone
  // across a restart.
  Result del = Ctl("delete pol");
  EXPECT_EQ(del.rc, 0) << del.out;
  EXPECT_NE(del.out.find("job pol deleted"), std::string::npos) << del.out;
  EXPECT_EQ(Ctl("job pol").rc, 1);
  EXPECT_EQ(Ctl("delete pol").rc, 1) << "already gone";
  StopDaemon(SIGKILL);
  StartDaemon();
  WaitReady();
  EXPECT_EQ(Ctl("job pol").rc, 1) << "a deleted job came back after a restart";
}

TEST_F(DaemonTest, Kill9AndRestartLoseNothing) { Kill9MidRun(""); }

TEST_F(DaemonTest, Kill9AndRestartLoseNothingWithMultiplexedRanks) {
  // 8 ranks as 2 host sessions of 4: same guarantees as 8 Sessions.
  Kill9MidRun("--ranks_per_session=4");
}

void DaemonTest::Kill9MidRun(const std::string& loadgen_flags) {
  StartDaemon();
  WaitReady();
  const std::string trace = WriteSkewedTrace(dir_, 50);
  ASSERT_EQ(Shell(Loadgen("first", "--trace=" + trace, 60, loadgen_flags)).rc, 0);
  ASSERT_EQ(Ctl("claim gpu-2 gpu-3 --holder=sched --lease_seconds=600").rc, 0);
  nlohmann::json before = Json(Ctl("released --all", "--json"));
  nlohmann::json first_before = Json(Ctl("job first", "--json"));

  // A second job is mid-run when the coordinator dies.
  const std::string log = dir_ + "/loadgen.out";
  Result bg = Shell(Loadgen("second", "--scenario=moe --layers=32", 600,
                           loadgen_flags) + " > " +
                  log + " 2>&1 & echo $!");
  const pid_t loadgen = std::stoi(bg.out);
  uint64_t epoch_before = 0;
  for (int i = 0; i < 100 && epoch_before == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    Result r = Ctl("job second", "--json");
    if (r.rc == 0) {
      epoch_before =
          std::stoull(nlohmann::json::parse(r.out)["summary"]["epoch"]
                          .get<std::string>());
    }
  }
  ASSERT_GT(epoch_before, 0u) << "the second job never planned";
  StopDaemon(SIGKILL);
  absl::SleepFor(absl::Milliseconds(300));
  StartDaemon();
  WaitReady();

  // Nothing released or claimed was lost.
  nlohmann::json after = Json(Ctl("released --all", "--json"));
  EXPECT_EQ(after["gpus"], before["gpus"]);
  nlohmann::json first_after = Json(Ctl("job first", "--json"));
  EXPECT_EQ(first_after["summary"]["epoch"], first_before["summary"]["epoch"]);
  EXPECT_EQ(first_after["boundaries"], first_before["boundaries"]);
  // Epochs never go backwards.
  nlohmann::json second = Json(Ctl("job second", "--json"));
  EXPECT_GE(std::stoull(second["summary"]["epoch"].get<std::string>()),
            epoch_before);

  int st = 0;
  waitpid(loadgen, &st, 0);  // not our child: returns at once with -1
  for (int i = 0; i < 200 && kill(loadgen, 0) == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::ifstream in(log);
  std::string out((std::istreambuf_iterator<char>(in)),
                  std::istreambuf_iterator<char>());
  nlohmann::json summary = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << out;
  EXPECT_GT(summary["connects"].get<int>(), 8) << "agents reconnected";
  // No plan was applied twice: applied epochs strictly increase.
  uint64_t last = 0;
  for (const auto& p : summary["plans"]) {
    if (!p["applied"].get<bool>()) continue;
    EXPECT_GT(p["epoch"].get<uint64_t>(), last);
    last = p["epoch"].get<uint64_t>();
  }
  nlohmann::json final_job = Json(Ctl("job second", "--json"));
  EXPECT_EQ(std::stoull(final_job["summary"]["applied_epoch"].get<std::string>()),
            summary["applied_epoch"].get<uint64_t>());
}

TEST_F(DaemonTest, MutualTlsAndTokenAreEnforced) {
  if (Shell("command -v openssl").rc != 0) GTEST_SKIP() << "no openssl";
  const std::string d = dir_;
  ASSERT_EQ(Shell(absl::StrCat(DYNMO_SOURCE_DIR, "/tests/make-test-certs.sh ", d)).rc, 0);
  std::ofstream(d + "/token") << "t0ken\n";
  StartDaemon({"--tls_cert=" + d + "/server.pem", "--tls_key=" + d + "/server.key",
               "--tls_client_ca=" + d + "/ca.pem", "--token_file=" + d + "/token"});
  const std::string tls = absl::StrCat(
      "--coordinator_tls_ca=", d, "/ca.pem --coordinator_tls_cert=", d, "/client.pem --coordinator_tls_key=", d,
      "/client.key --coordinator_tls_server_name=localhost --timeout_s=3");
  WaitReady(tls + " --coordinator_token_file=" + d + "/token");
  EXPECT_EQ(Ctl("jobs", tls + " --coordinator_token_file=" + d + "/token").rc, 0);
  Result no_token = Ctl("jobs", tls);
  EXPECT_EQ(no_token.rc, 1);
  EXPECT_NE(no_token.out.find("code 16"), std::string::npos) << no_token.out;
  // TLS without a client certificate is refused by mutual TLS.
  EXPECT_NE(Ctl("jobs", absl::StrCat("--coordinator_tls_ca=", d,
                                     "/ca.pem --coordinator_tls_server_name=localhost "
                                     "--timeout_s=2 --coordinator_token_file=",
                                     d, "/token"))
                .rc,
            0);
  // Agents speak mutual TLS too, and carry the token.
  Result lg = Shell(absl::StrCat(
      bin_, "/dynmo-loadgen --coordinator=", address_, " --coordinator_token_file=", d, "/token",
      " --job=tls --agents=4 --iterations=20 --iteration_ms=10 --drain_s=0.3 ",
      "--scenario=moe --layers=8 --coordinator_tls_ca=", d, "/ca.pem --coordinator_tls_cert=", d,
      "/client.pem --coordinator_tls_key=", d, "/client.key --coordinator_tls_server_name=localhost"));
  ASSERT_EQ(lg.rc, 0) << lg.out;
  nlohmann::json summary = nlohmann::json::parse(lg.out);
  EXPECT_EQ(summary["connects"].get<int>(), 4);
  EXPECT_EQ(summary["reports_sent"].get<int>(), 80);
  // Plaintext against a TLS port fails too.
  EXPECT_NE(Ctl("jobs", "--timeout_s=2 --coordinator_token_file=" + d + "/token").rc, 0);
}

}  // namespace
