// dynmo-coordinator: the DynMo coordinator daemon. Serves the agent,
// scheduler and operator gRPC APIs for many jobs, exposes Prometheus
// metrics, and keeps its durable state in --state_dir. See
// coordinator/service/README.md and docs/protocol.md.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/address.h"
#include "cli/flag_parse.h"
#include "cli/program_info.h"
#include "core/partition.h"
#include "coordinator/service/event_log.h"
#include "coordinator/job/policy.h"
#include "coordinator/job/validation.h"
#include "coordinator/service/server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC listen address");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus /metrics listen address (empty: off), e.g. 0.0.0.0:9464");
ABSL_FLAG(std::string, state_dir, "",
          "directory for the crash-safe state (empty: in memory only)");
ABSL_FLAG(std::string, balancer, "optimal",
          "uniform|parameters|time|optimal|diffusion");
ABSL_FLAG(std::string, trigger, "auto", "every:N | on-event | auto | manual");
ABSL_FLAG(bool, repack, false, "re-pack onto fewer GPUs when possible");
ABSL_FLAG(double, repack_tolerance, 0.0,
          "bottleneck loss re-packing may accept, relative (0.05 = 5%)");
ABSL_FLAG(std::string, elastic, "release",
          "what re-packing does with the ranks it frees: release (hand them "
          "back) | reshape (more data-parallel replicas of a shorter pipeline "
          "when the cost model predicts more throughput)");
ABSL_FLAG(double, allreduce_bandwidth, 25e9,
          "re-shaping: per-rank gradient all-reduce bus bandwidth, bytes/s");
ABSL_FLAG(double, allreduce_overlap, 0.5,
          "re-shaping: fraction of the all-reduce hidden behind the backward pass");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (enables TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM server key");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA for client certificates (enables mutual TLS)");
ABSL_FLAG(std::string, token_file, "",
          "file holding the bearer token required on scheduler and operator "
          "RPCs, and on agent RPCs unless --agent_token_file (empty: not "
          "required)");
ABSL_FLAG(int, plan_lead_iterations, 10,
          "a plan applies this many iterations after the newest report");
ABSL_FLAG(double, prepare_timeout_s, 10, "abort a plan not prepared by then");
ABSL_FLAG(std::string, commit, "two-phase",
          "two-phase: PREPARE, all PREPARED, COMMIT; in-band: the PREPARE is "
          "the commit and the trainers' in-band agreement decides (fewer "
          "messages; trainers must do the in-band MIN, docs/protocol.md)");
ABSL_FLAG(int, auto_horizon_iterations, 200,
          "auto trigger: iterations over which a gain must pay back");
ABSL_FLAG(double, migration_bandwidth, 10e9,
          "auto trigger: bytes/s assumed for layer migration");
ABSL_FLAG(double, auto_noise_sigmas, 3.0,
          "auto trigger: a gain must be this many standard deviations of the "
          "measured timing noise (0 = ignore noise)");
ABSL_FLAG(std::string, principals_file, "",
          "named principals: one '<token or x509:identity> <name> "
          "<agent,operator,scheduler>' per line; every RPC needs a principal "
          "with its service's role, and a scheduler's lease holder is its "
          "name (replaces --token_file and --agent_token_file)");
ABSL_FLAG(std::string, agent_token_file, "",
          "bearer token every AgentService RPC (trainer ranks) must carry; "
          "empty: --token_file's");
ABSL_FLAG(std::string, port_file, "",
          "once listening, write the gRPC port to this file (atomically: "
          "FILE.tmp, then renamed), for a parent that asked for port 0");
ABSL_FLAG(int, max_jobs, 1024, "jobs served at most");
ABSL_FLAG(int, max_jobs_per_principal, 64,
          "jobs one named principal (--principals_file) may create (0: no cap)");
ABSL_FLAG(int, max_ranks_per_job, 2048,
          "ranks (pipeline_size x data_parallel_size) one job may have; a "
          "larger registration is refused with RESOURCE_EXHAUSTED (1..65536; "
          "memory per job: docs/operations.md)");
ABSL_FLAG(int, max_layers, 1024,
          "layers one job may have; a larger registration is refused with "
          "RESOURCE_EXHAUSTED (1..65536)");
ABSL_FLAG(int64_t, max_replica_layers, 8192,
          "data_parallel_size x num_layers one job may have (one cost "
          "estimate each); larger: RESOURCE_EXHAUSTED (1..2^20)");
ABSL_FLAG(std::string, metrics_auth_file, "",
          "a file holding USER:PASSWORD: /metrics then wants HTTP basic auth "
          "(empty: /metrics is open)");
ABSL_FLAG(bool, reflection, true,
          "serve gRPC server reflection (grpcurl list); health is always served");
ABSL_FLAG(double, job_expiry_s, 86400,
          "delete a job after this many seconds with no connected rank and "
          "no registration, report or ack (0: never)");
ABSL_FLAG(bool, log_plans, true,
          "log the plan events (plan_issued, plan_committed, plan_applied, "
          "repack) at info; false: at debug (plan_aborted stays a warning)");
ABSL_FLAG(std::string, log_format, "logfmt",
          "event log lines on stderr: logfmt (key=value) or json");
ABSL_FLAG(std::string, log_level, "info",
          "least level logged: debug | info | warning | error");
ABSL_FLAG(int, max_message_bytes, 4 << 20, "largest accepted gRPC message");
ABSL_FLAG(int, max_watchers, 64,
          "WatchReleased streams served at once (no thread each); more are "
          "refused with RESOURCE_EXHAUSTED (1..100000)");
ABSL_FLAG(int64_t, watcher_backlog_events, 16384,
          "events one WatchReleased reader may fall behind the pool (the pool "
          "keeps the last 4,096); one further behind is ended with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, watcher_backlog_bytes, 1 << 20,
          "bytes queued for one WatchReleased reader at most, ~350 per event; "
          "its window of events (at most 64) is held under half of it");
ABSL_FLAG(int, max_streams_per_connection, 1024,
          "streams one client connection holds open at once (HTTP/2 "
          "MAX_CONCURRENT_STREAMS); more wait on the client's side");
ABSL_FLAG(double, hello_timeout_s, 10,
          "a Session or HostSession that sends no hello within this is ended "
          "with DEADLINE_EXCEEDED");
ABSL_FLAG(int, max_pending_sessions, 1024,
          "Session and HostSession streams waiting for their hello, in all; "
          "more are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_pending_sessions_per_peer, 64,
          "... and from one peer host");
ABSL_FLAG(int, malloc_arenas, 2,
          "glibc malloc arenas the daemon's threads share (M_ARENA_MAX, set "
          "before any thread starts); 0 keeps glibc's default (8 per core). "
          "Few arenas hand memory back after clients leave (docs/operations.md)");
ABSL_FLAG(int64_t, iteration_window, 1000000,
          "refuse a report or ack whose iteration is more than this beyond "
          "the job's newest (INVALID_ARGUMENT)");
ABSL_FLAG(int64_t, epoch_window, 1000000,
          "refuse a registration whose applied or pending epoch is more than "
          "this beyond the job's epoch (within it, a newer one is refused unless "
          "the rank is the first of a job that never planned)");

namespace {

// The numeric flags a typo or a sign error would make meaningless; empty
// when all are in range, else the first complaint.
std::string BadNumbers() {
  const double timeout = absl::GetFlag(FLAGS_prepare_timeout_s);
  if (!(std::isfinite(timeout) && timeout > 0)) {
    return "--prepare_timeout_s must be finite and > 0";
  }
  const double bandwidth = absl::GetFlag(FLAGS_migration_bandwidth);
  if (!(std::isfinite(bandwidth) && bandwidth > 0)) {
    return "--migration_bandwidth must be finite and > 0 (bytes/s)";
  }
  const double allreduce = absl::GetFlag(FLAGS_allreduce_bandwidth);
  if (!(std::isfinite(allreduce) && allreduce > 0)) {
    return "--allreduce_bandwidth must be finite and > 0 (bytes/s)";
  }
  const double overlap = absl::GetFlag(FLAGS_allreduce_overlap);
  if (!(overlap >= 0 && overlap <= 1)) return "--allreduce_overlap must be in [0, 1]";
  if (absl::GetFlag(FLAGS_auto_horizon_iterations) < 1) {
    return "--auto_horizon_iterations must be >= 1";
  }
  if (absl::GetFlag(FLAGS_max_jobs) < 1) return "--max_jobs must be >= 1";
  const int ranks = absl::GetFlag(FLAGS_max_ranks_per_job);
  if (ranks < 1 || ranks > dynmo::service::kMaxRanksPerJob) {
    return absl::StrCat("--max_ranks_per_job must be in [1, ",
                        dynmo::service::kMaxRanksPerJob, "]");
  }
  const int layers = absl::GetFlag(FLAGS_max_layers);
  if (layers < 1 || layers > dynmo::service::kMaxLayers) {
    return absl::StrCat("--max_layers must be in [1, ", dynmo::service::kMaxLayers, "]");
  }
  const int64_t replica_layers = absl::GetFlag(FLAGS_max_replica_layers);
  if (replica_layers < 1 || replica_layers > dynmo::service::kMaxReplicaLayers) {
    return absl::StrCat("--max_replica_layers must be in [1, ",
                        dynmo::service::kMaxReplicaLayers, "]");
  }
  for (const auto* window : {&FLAGS_iteration_window, &FLAGS_epoch_window}) {
    const int64_t w = absl::GetFlag(*window);
    if (w < 1 || w > (int64_t{1} << 53)) {
      return absl::StrCat("--", absl::GetFlagReflectionHandle(*window).Name(),
                          " must be in [1, 2^53]");
    }
  }
  const int watchers = absl::GetFlag(FLAGS_max_watchers);
  if (watchers < 1 || watchers > 100000) return "--max_watchers must be in [1, 100000]";
  if (absl::GetFlag(FLAGS_watcher_backlog_events) < 1 ||
      absl::GetFlag(FLAGS_watcher_backlog_bytes) < 4096) {
    return "--watcher_backlog_events must be >= 1 and --watcher_backlog_bytes >= 4096";
  }
  const double hello = absl::GetFlag(FLAGS_hello_timeout_s);
  if (!(hello > 0 && hello <= 86400)) return "--hello_timeout_s must be in (0, 86400]";
  if (absl::GetFlag(FLAGS_max_streams_per_connection) < 1) {
    return "--max_streams_per_connection must be >= 1";
  }
  if (absl::GetFlag(FLAGS_max_pending_sessions) < 1 ||
      absl::GetFlag(FLAGS_max_pending_sessions_per_peer) < 1) {
    return "--max_pending_sessions and --max_pending_sessions_per_peer must be >= 1";
  }
  if (absl::GetFlag(FLAGS_max_message_bytes) < 4096) {
    return "--max_message_bytes must be >= 4096";
  }
  return "";
}

// Logs why the daemon cannot start (one event line) and returns `code`:
// 2 for a bad flag, 1 when it could not start with good ones.
int Refuse(int code, absl::string_view why) {
  dynmo::service::LogEvent(dynmo::service::LogLevel::kError,
                           code == 2 ? "bad_flag" : "start_failed", {{"error", why}});
  return code;
}

// The listen addresses (cli/address.h): HOST:PORT, [IPV6]:PORT or
// unix:PATH (0.0.0.0:PORT for every interface); empty allowed for a
// disabled endpoint.
std::string BadAddress(absl::string_view flag, const std::string& address) {
  if (address.empty()) return "";
  dynmo::cli::AddressRules rules;
  rules.port_zero = true;
  absl::Status s = dynmo::cli::CheckAddress(flag, address, rules);
  return s.ok() ? "" : std::string(s.message());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dynmo-coordinator --listen ADDR [--metrics_listen ADDR] "
      "[--state_dir DIR] [--trigger every:N|on-event|auto|manual] ...");
  if (dynmo::cli::HandleHelpOrVersion(argc, argv, "dynmo-coordinator",
                                       absl::ProgramUsageMessage())) {
    return 0;
  }
  // One bad_flag line and exit 2 for an unknown flag, a value that does not
  // parse, or any positional argument (the daemon takes none).
  absl::StatusOr<std::vector<char*>> positional = dynmo::cli::ParseFlags(argc, argv);
  if (!positional.ok()) return Refuse(2, positional.status().message());
  if (positional->size() > 1) {
    return Refuse(2, absl::StrCat("unexpected argument '", (*positional)[1],
                                  "' (the coordinator takes flags only)"));
  }
  absl::ParseCommandLine(argc, argv);  // the same values; cannot fail now
  if (absl::Status s = dynmo::service::ConfigureEventLog(absl::GetFlag(FLAGS_log_format),
                                                         absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    return Refuse(2, s.message());
  }
  // absl's deadlock detector (on in this distribution's absl build) records
  // every Mutex acquisition in a global graph under a global lock: ~5% of
  // the daemon's CPU at 4,096 sessions, serialising the gRPC threads.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Before any thread starts: each thread that allocates picks an arena and
  // keeps what it freed there, so with glibc's default (8 per core) a burst
  // served on many gRPC threads leaves live fragments in many arenas that
  // malloc_trim cannot return. Two measured the same CPU, delivery and peak
  // as the default under 4,096 agents (docs/operations.md).
  if (const int arenas = absl::GetFlag(FLAGS_malloc_arenas); arenas < 0 || arenas > 1024) {
    return Refuse(2, "--malloc_arenas must be in [0, 1024]");
  } else if (arenas > 0 && mallopt(M_ARENA_MAX, arenas) != 1) {
    return Refuse(2, absl::StrCat("--malloc_arenas=", arenas, ": mallopt refused it"));
  }
  using namespace dynmo;
  // Block SIGINT/SIGTERM before any thread starts (threads inherit the mask)
  // and take them synchronously with sigwait below: no handler, no races.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  service::ServerOptions opts;
  opts.listen = absl::GetFlag(FLAGS_listen);
  opts.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  opts.tls = {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
              absl::GetFlag(FLAGS_tls_client_ca)};
  opts.token_file = absl::GetFlag(FLAGS_token_file);
  opts.agent_token_file = absl::GetFlag(FLAGS_agent_token_file);
  opts.principals_file = absl::GetFlag(FLAGS_principals_file);
  opts.metrics_auth_file = absl::GetFlag(FLAGS_metrics_auth_file);
  opts.reflection = absl::GetFlag(FLAGS_reflection);
  opts.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  opts.max_watchers = absl::GetFlag(FLAGS_max_watchers);
  opts.watcher_backlog_events = absl::GetFlag(FLAGS_watcher_backlog_events);
  opts.watcher_backlog_bytes = absl::GetFlag(FLAGS_watcher_backlog_bytes);
  opts.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  opts.pending.hello_timeout = absl::Seconds(absl::GetFlag(FLAGS_hello_timeout_s));
  opts.pending.max_pending = absl::GetFlag(FLAGS_max_pending_sessions);
  opts.pending.max_pending_per_peer = absl::GetFlag(FLAGS_max_pending_sessions_per_peer);
  opts.coordinator.state_dir = absl::GetFlag(FLAGS_state_dir);
  opts.coordinator.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  opts.coordinator.max_jobs_per_principal = absl::GetFlag(FLAGS_max_jobs_per_principal);
  opts.coordinator.max_ranks_per_job = absl::GetFlag(FLAGS_max_ranks_per_job);
  opts.coordinator.max_layers = absl::GetFlag(FLAGS_max_layers);
  opts.coordinator.max_replica_layers = absl::GetFlag(FLAGS_max_replica_layers);
  if (opts.coordinator.max_jobs_per_principal < 0) {
    return Refuse(2, "--max_jobs_per_principal must be >= 0");
  }
  const double expiry_s = absl::GetFlag(FLAGS_job_expiry_s);
  if (!(expiry_s >= 0 && expiry_s <= 1e9)) {
    return Refuse(2, "--job_expiry_s must be in [0, 1e9]");
  }
  opts.coordinator.job_expiry =
      expiry_s == 0 ? absl::InfiniteDuration() : absl::Seconds(expiry_s);
  service::JobOptions& job = opts.coordinator.job;
  job.plan_event_level = absl::GetFlag(FLAGS_log_plans) ? service::LogLevel::kInfo
                                                         : service::LogLevel::kDebug;
  absl::StatusOr<core::PartitionMethod> balancer =
      core::ParsePartitionMethod(absl::GetFlag(FLAGS_balancer));
  absl::StatusOr<service::Trigger> trigger =
      service::ParseTrigger(absl::GetFlag(FLAGS_trigger));
  if (!balancer.ok() || !trigger.ok()) {
    return Refuse(2, (!balancer.ok() ? balancer.status() : trigger.status()).message());
  }
  const double tolerance = absl::GetFlag(FLAGS_repack_tolerance);
  if (!(tolerance >= 0 && tolerance <= 10)) {
    return Refuse(2, "--repack_tolerance in [0, 10]");
  }
  job.default_policy.balancer = *balancer;
  job.default_policy.trigger = *trigger;
  job.default_policy.repack = absl::GetFlag(FLAGS_repack);
  job.default_policy.repack_tolerance = tolerance;
  absl::StatusOr<service::Elastic> elastic =
      service::ParseElastic(absl::GetFlag(FLAGS_elastic));
  if (!elastic.ok()) {
    std::fprintf(stderr, "dynmo-coordinator: --%s\n",
                 std::string(elastic.status().message()).c_str());
    return 2;
  }
  job.default_policy.elastic = *elastic;
  job.plan_lead_iterations = absl::GetFlag(FLAGS_plan_lead_iterations);
  job.iteration_window = absl::GetFlag(FLAGS_iteration_window);
  job.epoch_window = static_cast<uint64_t>(absl::GetFlag(FLAGS_epoch_window));
  job.prepare_timeout = absl::Seconds(absl::GetFlag(FLAGS_prepare_timeout_s));
  const std::string commit = absl::GetFlag(FLAGS_commit);
  if (commit != "two-phase" && commit != "in-band") {
    return Refuse(2, "--commit is two-phase or in-band");
  }
  job.in_band_commit = commit == "in-band";
  job.auto_options.horizon_iterations =
      absl::GetFlag(FLAGS_auto_horizon_iterations);
  job.auto_options.bandwidth_bytes_per_s =
      absl::GetFlag(FLAGS_migration_bandwidth);
  job.auto_options.noise_sigmas = absl::GetFlag(FLAGS_auto_noise_sigmas);
  job.auto_options.data_parallel.allreduce_bandwidth_bytes_per_s =
      absl::GetFlag(FLAGS_allreduce_bandwidth);
  job.auto_options.data_parallel.overlap = absl::GetFlag(FLAGS_allreduce_overlap);
  job.auto_options.data_parallel.copy_bandwidth_bytes_per_s =
      absl::GetFlag(FLAGS_migration_bandwidth);
  if (!(job.auto_options.noise_sigmas >= 0) ||
      !std::isfinite(job.auto_options.noise_sigmas)) {
    return Refuse(2, "--auto_noise_sigmas must be finite and >= 0");
  }
  if (job.plan_lead_iterations < 2) {
    return Refuse(2, "--plan_lead_iterations >= 2");
  }
  if (std::string bad = BadNumbers(); !bad.empty()) {
    return Refuse(2, bad);
  }
  if (opts.listen.empty()) return Refuse(2, "--listen must not be empty");
  for (const auto& [flag, address] : {std::pair<const char*, const std::string*>{
                                          "listen", &opts.listen},
                                      {"metrics_listen", &opts.metrics_listen}}) {
    if (std::string bad = BadAddress(flag, *address); !bad.empty()) {
      return Refuse(2, bad);
    }
  }
  // Checked whether or not /metrics is on: a file that would be refused
  // once metrics are turned on is a mistake now.
  if (!opts.metrics_auth_file.empty()) {
    if (absl::Status s = service::ReadMetricsLogin(opts.metrics_auth_file).status(); !s.ok()) {
      return Refuse(2, s.message());
    }
  }

  absl::StatusOr<std::unique_ptr<service::CoordinatorServer>> server =
      service::CoordinatorServer::Start(opts);
  if (!server.ok()) return Refuse(1, server.status().ToString());
  service::LogEvent(service::LogLevel::kInfo, "listening",
                    {{"address", opts.listen},
                     {"port", (*server)->port()},
                     {"metrics_port", (*server)->metrics_port()},
                     {"state_dir", opts.coordinator.state_dir},
                     {"version", cli::Version()}});
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    const bool written = f != nullptr && std::fprintf(f, "%d\n", (*server)->port()) > 0;
    if (f != nullptr) std::fclose(f);
    if (!written || std::rename(tmp.c_str(), path.c_str()) != 0) {
      (*server)->Shutdown();
      return Refuse(1, absl::StrCat("cannot write --port_file ", path));
    }
  }

  int sig = 0;
  sigwait(&signals, &sig);
  service::LogEvent(service::LogLevel::kInfo, "shutdown", {{"signal", sig}});
  (*server)->Shutdown();
  return 0;
}
