// dynmo-launch: the single-node launcher, like `torchrun --standalone`.
//
//   dynmo-launch --nproc N [--coordinator embedded|ADDR|none]
//                [--master_port P] [--job NAME] [--stop_grace_s S]
//                [--relay=true|false] [--coordinator_token_file F]
//                [--coordinator_tls_ca F ...] -- PROGRAM ARGS...
//
// Starts N ranks of PROGRAM with torchrun's environment and DynMo's, runs
// the coordinator in-process on a loopback port unless told otherwise,
// carries the ranks' sessions to it on one stream (the node relay),
// prefixes every output line with its rank, and stops the whole job when
// any rank fails. See launcher/README.md for the exit statuses.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/client_credentials.h"
#include "cli/coordinator_flags.h"
#include "cli/program_info.h"
#include "coordinator/service/embedded_coordinator.h"
#include "coordinator/service/event_log.h"
#include "launcher/local_relay.h"
#include "launcher/orphan_guard.h"
#include "launcher/stuck_rank.h"
#include "launcher/rank_env.h"
#include "launcher/rank_supervisor.h"

ABSL_FLAG(int, nproc, 0, "number of ranks to start on this node (required)");
ABSL_FLAG(std::string, coordinator, "embedded",
          "embedded: run the coordinator inside the launcher on a loopback "
          "port; HOST:PORT: an external coordinator; none: no coordinator");
ABSL_FLAG(int, master_port, 0, "MASTER_PORT for the ranks (0: a free port)");
ABSL_FLAG(std::string, job, "",
          "DYNMO_JOB, the job's name at the coordinator (empty: PROGRAM's "
          "base name)");
ABSL_FLAG(double, stop_grace_s, 5,
          "seconds between SIGTERM and SIGKILL when stopping the ranks");
ABSL_FLAG(bool, relay, true,
          "carry the ranks' coordinator sessions on ONE stream per node: the "
          "launcher runs a node relay on a Unix-domain socket in a private "
          "directory and hands its address to the ranks as DYNMO_COORDINATOR "
          "(false: the ranks dial the coordinator themselves)");
ABSL_FLAG(double, stuck_timeout_s, 600,
          "with the relay: stop the job and name the rank when a rank has "
          "reported no finished iteration for this long (0: never)");
// --coordinator_token_file, --coordinator_tls_*: the relay's way to a
// secured coordinator (cli/coordinator_flags.h).
ABSL_FLAG(std::string, log_format, "logfmt",
          "the embedded coordinator's event log on stderr: logfmt or json");
ABSL_FLAG(std::string, log_level, "info",
          "least level of the embedded coordinator's events: debug | info | warning | error");

namespace {

using namespace dynmo;

constexpr int kMaxRanks = 1024;
constexpr char kUsage[] =
    "usage: dynmo-launch --nproc N [--coordinator embedded|ADDR|none] "
    "[--master_port P] [--job NAME] [--stop_grace_s S] [--relay=BOOL] "
    "[--coordinator_token_file F] [--coordinator_tls_ca F] "
    "[--coordinator_tls_cert F --coordinator_tls_key F] "
    "[--coordinator_tls_server_name N] [--log_format logfmt|json] [--log_level L] "
    "-- PROGRAM ARGS...";
constexpr const char* kLauncherFlags[] = {
    "nproc", "coordinator", "master_port", "job", "stop_grace_s", "relay", "stuck_timeout_s",
    "coordinator_token_file", "coordinator_tls_ca", "coordinator_tls_cert",
    "coordinator_tls_key", "coordinator_tls_server_name", "log_format", "log_level"};

// The launcher's command line: its own flags before "--", the program after.
struct LaunchCommand {
  std::vector<std::string> program;
  bool help = false;
};

bool IsLauncherFlag(absl::string_view name) {
  for (const char* f : kLauncherFlags) {
    if (name == f) return true;
  }
  return false;
}

// Parses argv into the absl flags above and the program. absl's own
// ParseCommandLine exits 1 on a bad flag and knows nothing of "--" as the
// start of another program's arguments, so the split and the errors are
// ours; the values still go through absl's parsers.
absl::StatusOr<LaunchCommand> ParseLaunchCommand(int argc, char** argv) {
  LaunchCommand cmd;
  int i = 1;
  for (; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      cmd.help = true;
      return cmd;
    }
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected argument '", arg, "': put the program after '--'"));
    }
    absl::string_view body = arg.substr(absl::StartsWith(arg, "--") ? 2 : 1);
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(body, absl::MaxSplits('=', 1));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(kv.first);
    if (!IsLauncherFlag(kv.first) || flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '--", kv.first, "'"));
    }
    std::string value;
    if (absl::StrContains(body, '=')) {
      value = std::string(kv.second);
    } else if (flag->IsOfType<bool>()) {
      value = "true";  // --relay alone
    } else if (i + 1 < argc && absl::string_view(argv[i + 1]) != "--") {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("flag --", kv.first, " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid value '", value, "' for --", kv.first, ": ", error));
    }
  }
  if (i + 1 >= argc) {
    return absl::InvalidArgumentError(
        "missing program: put it after '--', as in "
        "dynmo-launch --nproc 4 -- dynmo-train");
  }
  cmd.program.assign(argv + i + 1, argv + argc);
  return cmd;
}

absl::Status ValidateFlags() {
  const int nproc = absl::GetFlag(FLAGS_nproc);
  if (nproc < 1 || nproc > kMaxRanks) {
    return absl::InvalidArgumentError(
        nproc == 0 ? std::string("--nproc is required")
                   : absl::StrCat("--nproc must be 1 to ", kMaxRanks,
                                  ", not ", nproc));
  }
  const int port = absl::GetFlag(FLAGS_master_port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master_port must be 0 to 65535, not ", port));
  }
  if (absl::GetFlag(FLAGS_stop_grace_s) < 0) {
    return absl::InvalidArgumentError("--stop_grace_s must be >= 0");
  }
  const double stuck = absl::GetFlag(FLAGS_stuck_timeout_s);
  if (!(stuck >= 0 && stuck <= 1e7)) {
    return absl::InvalidArgumentError("--stuck_timeout_s must be in [0, 1e7]");
  }
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  if (absl::Status s = cli::CheckCoordinatorAddress(coordinator); !s.ok()) return s;
  absl::StatusOr<cli::CoordinatorClientFlags> client = cli::ReadCoordinatorClientFlags();
  if (!client.ok()) return client.status();
  if (client->secured() && (!absl::GetFlag(FLAGS_relay) || coordinator == "none")) {
    return absl::InvalidArgumentError(
        "--coordinator_token_file and --coordinator_tls_* are the relay's: "
        "they need --relay and a coordinator (without the relay, give them "
        "to the ranks)");
  }
  return absl::OkStatus();
}

// Returns a port free on the loopback interface right now. Like torchrun's,
// it can be taken by someone else before rank 0 binds it.
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int e = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("free port: ", strerror(e)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// The node relay for this launch, upstream to job.coordinator with the
// --coordinator_token_file / --coordinator_tls_* flags.
absl::StatusOr<std::unique_ptr<launcher::LocalRelay>> StartRelay(
    const launcher::JobEnvironment& job) {
  relay::NodeRelayConfig c;
  c.coordinator = job.coordinator;
  c.job = job.job;
  absl::StatusOr<cli::CoordinatorClientFlags> client = cli::ReadCoordinatorClientFlags();
  if (!client.ok()) return client.status();
  absl::StatusOr<agent::ClientCredentials> credentials = agent::CredentialsFrom(*client);
  if (!credentials.ok()) return credentials.status();
  c.channel = credentials->channel;
  c.token = credentials->token;
  return launcher::LocalRelay::Start(c);
}

int Usage(absl::string_view why) {
  std::fprintf(stderr, "dynmo-launch: %s (see dynmo-launch --help)\n",
               std::string(why).c_str());
  return 2;
}

int Fatal(absl::string_view why) {
  std::fprintf(stderr, "dynmo-launch: %s\n", std::string(why).c_str());
  return 1;
}

void PrintHelp() {
  std::printf("%s\n\nStarts N ranks of PROGRAM on this node with RANK, "
              "LOCAL_RANK, WORLD_SIZE,\nLOCAL_WORLD_SIZE, MASTER_ADDR, "
              "MASTER_PORT, DYNMO_COORDINATOR and DYNMO_JOB set.\n\n",
              kUsage);
  for (const char* name : kLauncherFlags) {
    absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    std::printf("  --%s (default %s)\n      %s\n", name,
                f->DefaultValue().c_str(), f->Help().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread starts, so every thread inherits the mask: these
  // signals are read from a signalfd by the supervisor, never handled
  // asynchronously. A shell starting us in the background may have left
  // SIGINT ignored, which would discard it even while blocked.
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor

  for (int i = 1; i < argc && absl::string_view(argv[i]) != "--"; ++i) {
    if (absl::string_view(argv[i]) == "--version") {
      std::printf("%s\n", dynmo::cli::VersionLine("dynmo-launch").c_str());
      return 0;
    }
  }
  absl::StatusOr<LaunchCommand> cmd = ParseLaunchCommand(argc, argv);
  if (!cmd.ok()) return Usage(cmd.status().message());
  if (cmd->help) {
    PrintHelp();
    return 0;
  }
  if (absl::Status valid = ValidateFlags(); !valid.ok()) {
    return Usage(valid.message());
  }
  if (absl::Status log = service::ConfigureEventLog(absl::GetFlag(FLAGS_log_format),
                                                    absl::GetFlag(FLAGS_log_level));
      !log.ok()) {
    return Usage(log.message());
  }

  launcher::JobEnvironment job;
  job.world_size = absl::GetFlag(FLAGS_nproc);
  job.job = absl::GetFlag(FLAGS_job);
  if (job.job.empty()) {
    const std::string& program = cmd->program[0];
    job.job = program.substr(program.rfind('/') + 1);
  }
  job.master_port = absl::GetFlag(FLAGS_master_port);
  if (job.master_port == 0) {
    absl::StatusOr<int> port = FreeLoopbackPort();
    if (!port.ok()) return Fatal(port.status().message());
    job.master_port = *port;
  }

  // Forked before the coordinator's threads exist.
  absl::StatusOr<std::unique_ptr<launcher::OrphanGuard>> guard =
      launcher::OrphanGuard::Start();
  if (!guard.ok()) return Fatal(guard.status().message());

  const std::string coordinator_flag = absl::GetFlag(FLAGS_coordinator);
  std::unique_ptr<service::EmbeddedCoordinator> embedded;
  if (coordinator_flag == "embedded") {
    absl::StatusOr<std::unique_ptr<service::EmbeddedCoordinator>> started =
        // The daemon's defaults; its events (plan_issued, plan_applied, ...)
        // go to our stderr as the daemon's do (event_log.h).
        service::EmbeddedCoordinator::Start(service::ServerOptions{});
    if (!started.ok()) {
      return Fatal(absl::StrCat("cannot start the embedded coordinator: ",
                                started.status().message()));
    }
    embedded = *std::move(started);
    job.coordinator = embedded->address();
  } else if (coordinator_flag != "none") {
    job.coordinator = coordinator_flag;
  }
  std::unique_ptr<launcher::LocalRelay> relay;
  if (!job.coordinator.empty() && absl::GetFlag(FLAGS_relay)) {
    absl::StatusOr<std::unique_ptr<launcher::LocalRelay>> started =
        StartRelay(job);
    if (!started.ok()) {
      if (embedded != nullptr) embedded->Shutdown();
      return Fatal(absl::StrCat("cannot start the node relay: ",
                                started.status().message()));
    }
    relay = *std::move(started);
  }
  std::fprintf(stderr,
               "dynmo-launch: %d ranks of %s, job %s, coordinator %s, "
               "master 127.0.0.1:%d\n",
               job.world_size, cmd->program[0].c_str(), job.job.c_str(),
               job.coordinator.empty()
                   ? "none"
                   : absl::StrCat(job.coordinator,
                                  embedded ? " (embedded)" : "",
                                  relay ? absl::StrCat(", ranks through the node relay at ",
                                                       relay->address())
                                        : "")
                         .c_str(),
               job.master_port);
  if (relay != nullptr) job.coordinator = relay->address();

  launcher::SupervisorOptions options;
  options.stop_grace = absl::Seconds(absl::GetFlag(FLAGS_stop_grace_s));
  options.guard = guard->get();
  const double stuck_s = absl::GetFlag(FLAGS_stuck_timeout_s);
  if (relay != nullptr && stuck_s > 0) {
    options.watchdog = [relay = relay.get(), launched = absl::Now(),
                        timeout = absl::Seconds(stuck_s)](
                           absl::Time now,
                           const std::vector<std::pair<int, pid_t>>& running) {
      const std::vector<dynmo::relay::RankProgress> progress = relay->progress();
      std::vector<launcher::RankLiveness> live;
      for (const auto& [rank, pid] : running) {
        launcher::RankLiveness l{rank, pid, -1, launched, launcher::ProcessStopped(pid)};
        for (const dynmo::relay::RankProgress& p : progress) {
          if (p.rank != rank) continue;
          l.last_iteration = p.last_iteration;
          l.last_progress = std::max(launched, p.last_report);
        }
        live.push_back(l);
      }
      return launcher::FindStuckRank(live, now, timeout);
    };
  }
  launcher::RankSupervisor supervisor(options);
  const std::vector<std::string> base_env = launcher::CurrentEnvironment();
  for (int rank = 0; rank < job.world_size; ++rank) {
    if (!supervisor
             .Start(rank, cmd->program,
                    launcher::RankEnvironment(base_env, job, rank))
             .ok()) {
      break;  // Run() stops the ranks already started and says why
    }
  }
  const launcher::LaunchOutcome outcome = supervisor.Run();
  relay.reset();
  if (embedded != nullptr) embedded->Shutdown();
  (*guard)->Disarm();
  if (!outcome.summary.empty()) {
    std::fprintf(stderr, "%s\n", outcome.summary.c_str());
  }
  return outcome.exit_code;
}
