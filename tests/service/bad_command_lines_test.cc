// Every program answers a bad command line the same way: one line on
// stderr and exit code 2, before it starts anything — an unknown flag, a
// value that does not parse or is out of range, an address that is not
// one, an extra positional argument, a malformed file named by a flag
// whether or not the feature is on (issue 25 item 6). Spawns the binaries
// from DYNMO_BIN_DIR.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/service/state_dir_fixture.h"

namespace dynmo::service {
namespace {

struct Result {
  int rc = -1;
  std::string out;
};

// Runs `command` with stderr into stdout; its exit code and output.
Result Shell(const std::string &command) {
  Result r;
  std::FILE *p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class BadCommandLinesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char *dir = std::getenv("DYNMO_BIN_DIR");
    bin_ = dir != nullptr ? dir : "build/bin";
    dir_ = TempDir();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `program args` exits 2 with exactly one line.
  void ExpectOneLineAndExit2(const std::string &program, const std::string &args) {
    const Result r = Shell(absl::StrCat("timeout 20 ", bin_, "/", program, " ", args));
    EXPECT_EQ(r.rc, 2) << program << " " << args << ":\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << program << " " << args << ":\n"
                                                               << r.out;
  }

  std::string bin_;
  std::string dir_;
};

TEST_F(BadCommandLinesTest, TheCoordinator) {
  std::ofstream(dir_ + "/login") << "no-colon-here\n";
  for (const std::string &args : std::vector<std::string>{
           "--listen='[::1'", "--listen=[::1]:99999", "--listen=bad:::1", "--listen=host:port",
           "--prepare_timeout_s=abc", "--max_jobs=1e99", "--no_such_flag=1", "--max_jobs",
           "--listen=127.0.0.1:0 extra", "--max_layers=0", "--max_ranks_per_job=70000",
           "--max_watchers=0", "--listen=127.0.0.1:0 --metrics_auth_file=" + dir_ + "/login",
           "--listen=127.0.0.1:0 --metrics_auth_file=" + dir_ + "/missing"}) {
    ExpectOneLineAndExit2("dynmo-coordinator", args);
  }
}

TEST_F(BadCommandLinesTest, Ctl) {
  for (const std::string args :
       {"--timeout_s=-1 jobs", "--timeout_s=abc jobs", "--timeout_s=nan jobs",
        "--lease_seconds=-5 claim gpu-1 --holder=me", "--coordinator=bad::: jobs",
        "--coordinator='[::1' jobs", "jobs extra", "released extra", "job a b", "--nosuch jobs", "",
        "frobnicate", "--coordinator_tls_cert=c.pem jobs", "--tls_ca=ca.pem jobs",
        "--coordinator_token_file=/no/such/token jobs"}) {
    ExpectOneLineAndExit2("dynmo-ctl", args);
  }
}

TEST_F(BadCommandLinesTest, Loadgen) {
  for (const std::string args :
       {"--coordinator=bad::: --job=j --scenario=moe", "--agents=abc --scenario=moe",
        "--scenario=moe extra", "--drain_s=-1 --scenario=moe", "--nosuch=1",
        "--coordinator_tls_key=k.pem --scenario=moe",
        "--coordinator_token_file=/no/such/token --scenario=moe"}) {
    ExpectOneLineAndExit2("dynmo-loadgen", args);
  }
}

TEST_F(BadCommandLinesTest, Launch) {
  for (const std::string args :
       {"--nproc=1 --coordinator=bad::: -- true", "--nproc=abc -- true",
        "--nproc=1 --coordinator='[::1' -- true", "--nproc=1 extra -- true"}) {
    ExpectOneLineAndExit2("dynmo-launch", args);
  }
}

}  // namespace
}  // namespace dynmo::service
