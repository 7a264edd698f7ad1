// dynmo-loadgen: N simulated trainer ranks, each a real Agent (agent/agent.h)
// talking gRPC to a coordinator, replaying the decision core's scenario
// generator or a recorded trace. The whole DynMo loop runs without LibTorch:
//
//   each iteration k (paced by --iteration_ms):
//     every active rank asks its agent for the plan due at k; the ranks
//     agree in-band (all must hold the same committed epoch, the simulated
//     MIN all-reduce) and then all apply it or all fail it;
//     every active rank reports its stage's layer costs of trace record k
//     under the layout it runs.
//
// Ranks are laid out as --dp replicas of a --agents/--dp stage pipeline
// (default: one replica of N stages); rank = replica * stages + stage.
// --ranks_per_session K > 1 hosts K consecutive ranks per process-like
// agent::HostAgent over ONE multiplexed HostSession stream (one per node in
// production: 8), instead of one Agent and one Session per rank.
// --relay_ranks_per_node K runs one relay::NodeRelay per K ranks (what
// dynmo-launch runs on each node): every rank keeps its own Agent, which
// dials its node's relay on a Unix-domain socket, and each relay carries its
// node to the coordinator on one HostSession.
// Prints one JSON summary: reports sent, samples dropped, plans applied and
// failed, per-plan delivery latency (decision to the last rank holding the
// COMMIT), the imbalance of the last record under the initial and the final
// layout, released stages.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/channel.h"
#include "agent/client_credentials.h"
#include "agent/host_agent.h"
#include "cli/address.h"
#include "cli/coordinator_flags.h"
#include "cli/flag_parse.h"
#include "cli/program_info.h"
#include "clients/loadgen_relays.h"
#include "clients/loadgen_trace.h"
#include "core/partition.h"
#include "core/trace.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "coordinator address");
ABSL_FLAG(std::string, job, "loadgen", "job name");
ABSL_FLAG(int, agents, 8, "simulated ranks (stages x replicas)");
ABSL_FLAG(int, dp, 1, "data-parallel replicas; stages = agents / dp");
ABSL_FLAG(int, iterations, 100, "iterations to run");
ABSL_FLAG(std::string, scenario, "",
          "pruning|freezing|sparse-attention|early-exit|moe|mod");
ABSL_FLAG(std::string, trace, "", "JSON Lines trace to replay (instead)");
ABSL_FLAG(int, layers, 0, "scenario layers (default max(48, 2 * stages))");
ABSL_FLAG(uint64_t, seed, 1, "scenario seed");
ABSL_FLAG(int, iteration_ms, 20, "wall time per simulated iteration (0: flat out)");
ABSL_FLAG(int, agents_per_channel, 64, "agents sharing one TCP connection");
ABSL_FLAG(int, queue_capacity, 64, "agent sample queue");
ABSL_FLAG(int, microbatches, 8, "micro-batches per iteration (registered)");
ABSL_FLAG(double, connect_timeout_s, 60, "wait this long for every session");
ABSL_FLAG(double, drain_s, 2, "after the last iteration, let reports drain");
ABSL_FLAG(std::string, host_prefix, "sim-host-", "simulated host names");
ABSL_FLAG(int, threads, 2, "threads that send the simulated reports");
ABSL_FLAG(int, ranks_per_session, 1,
          "ranks multiplexed over one HostSession (1: one Session per rank)");
ABSL_FLAG(int, relay_ranks_per_node, 0,
          "ranks per simulated node behind a node relay (relay/node_relay.h): "
          "each rank runs its own Agent against its node's relay on a "
          "Unix-domain socket, each relay carries its node on one HostSession "
          "(0: no relays)");

namespace {

using namespace dynmo;

int Die(const std::string& why) {
  std::fprintf(stderr, "dynmo-loadgen: %s\n", why.c_str());
  return 2;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dynmo-loadgen --coordinator ADDR --job NAME --agents N --iterations K "
      "(--scenario NAME | --trace FILE) [--dp R] [--iteration_ms MS]");
  if (dynmo::cli::HandleHelpOrVersion(argc, argv, "dynmo-loadgen",
                                       absl::ProgramUsageMessage())) {
    return 0;
  }
  cli::ParseFlagsOrExit(argc, argv, "dynmo-loadgen", /*max_positional=*/0);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status s = cli::CheckAddress("coordinator", absl::GetFlag(FLAGS_coordinator));
      !s.ok()) {
    return Die(std::string(s.message()));
  }
  for (const auto* seconds : {&FLAGS_connect_timeout_s, &FLAGS_drain_s}) {
    const double v = absl::GetFlag(*seconds);
    if (!(std::isfinite(v) && v >= 0 && v <= 1e6)) {
      return Die(absl::StrCat("--", absl::GetFlagReflectionHandle(*seconds).Name(),
                              " must be in [0, 1e6] seconds"));
    }
  }
  if (absl::GetFlag(FLAGS_iteration_ms) < 0 || absl::GetFlag(FLAGS_layers) < 0 ||
      absl::GetFlag(FLAGS_threads) < 1 || absl::GetFlag(FLAGS_queue_capacity) < 1 ||
      absl::GetFlag(FLAGS_microbatches) < 1 || absl::GetFlag(FLAGS_agents_per_channel) < 1) {
    return Die("--iteration_ms and --layers must be >= 0; --threads, --queue_capacity, "
               "--microbatches and --agents_per_channel >= 1");
  }
  const int agents = absl::GetFlag(FLAGS_agents);
  const int dp = absl::GetFlag(FLAGS_dp);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  if (agents < 1 || dp < 1 || agents % dp != 0) {
    return Die("--agents must be a positive multiple of --dp");
  }
  if (iterations < 1) return Die("--iterations must be >= 1");
  const int per_session = absl::GetFlag(FLAGS_ranks_per_session);
  if (per_session < 1 || agents % per_session != 0) {
    return Die("--agents must be a positive multiple of --ranks_per_session");
  }
  const int per_node = absl::GetFlag(FLAGS_relay_ranks_per_node);
  if (per_node < 0 || (per_node > 0 && agents % per_node != 0)) {
    return Die("--agents must be a positive multiple of --relay_ranks_per_node");
  }
  if (per_node > 0 && per_session > 1) {
    return Die("--relay_ranks_per_node and --ranks_per_session > 1 exclude each other");
  }
  const int stages = agents / dp;
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  const std::string trace_file = absl::GetFlag(FLAGS_trace);
  clients::LoadgenTraceSource source;
  source.scenario = scenario;
  source.trace_file = trace_file;
  source.layers = absl::GetFlag(FLAGS_layers);
  source.iterations = iterations;
  source.seed = absl::GetFlag(FLAGS_seed);
  source.stages = stages;
  absl::StatusOr<core::Trace> loaded = clients::LoadgenTrace(source);
  if (!loaded.ok()) return Die(std::string(loaded.status().message()));
  const core::Trace trace = *std::move(loaded);
  const int num_layers = static_cast<int>(trace.front().layers.size());

  // Token and TLS: the --coordinator_* flags every client shares; the
  // token is the agents' (the coordinator's --agent_token_file, else its
  // --token_file).
  absl::StatusOr<cli::CoordinatorClientFlags> client = cli::ReadCoordinatorClientFlags();
  if (!client.ok()) return Die(std::string(client.status().message()));
  absl::StatusOr<agent::ClientCredentials> credentials = agent::CredentialsFrom(*client);
  if (!credentials.ok()) return Die(std::string(credentials.status().message()));
  agent::ChannelOptions co = credentials->channel;
  const std::string token = credentials->token;
  const int per_channel = std::max(1, absl::GetFlag(FLAGS_agents_per_channel));
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i * per_channel < agents; ++i) {
    co.index = i;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> c =
        agent::MakeChannel(absl::GetFlag(FLAGS_coordinator), co);
    if (!c.ok()) return Die(std::string(c.status().message()));
    channels.push_back(*c);
  }

  // Node relays: one per simulated node (loadgen_relays.h).
  clients::LoadgenRelays relays;
  if (absl::Status st = relays.Start(per_node > 0 ? agents / per_node : 0,
                                     absl::GetFlag(FLAGS_coordinator), *credentials,
                                     absl::GetFlag(FLAGS_job), absl::GetFlag(FLAGS_host_prefix));
      !st.ok()) {
    return Die(std::string(st.message()));
  }

  // The layout every rank runs; the in-band agreement keeps it one layout.
  std::vector<int> boundaries = core::PartitionUniform(num_layers, stages);
  std::vector<int> active;
  for (int s = 0; s < stages; ++s) active.push_back(s);
  const std::vector<int> initial_boundaries = boundaries;

  std::vector<std::unique_ptr<agent::Agent>> single;    // per_session == 1
  std::vector<std::unique_ptr<agent::HostAgent>> hosts;  // per_session > 1
  // Every simulated rank, whichever transport carries it: an Agent is the
  // one HostedRank of its own session, a HostAgent hands out one per rank.
  std::vector<agent::HostedRank*> ranks;
  std::vector<agent::AgentConfig> pending_host;
  for (int r = 0; r < agents; ++r) {
    agent::AgentConfig c;
    c.shared_channel = channels[static_cast<size_t>(r / per_channel)];
    c.token = token;
    c.job = absl::GetFlag(FLAGS_job);
    c.rank = r;
    c.pipeline_rank = r % stages;
    c.data_parallel_rank = r / stages;
    c.pipeline_size = stages;
    c.data_parallel_size = dp;
    c.host = absl::StrCat(absl::GetFlag(FLAGS_host_prefix), r / 8);
    c.device = r % 8;
    c.memory_capacity_bytes = 80LL << 30;
    c.num_layers = num_layers;
    c.boundaries = boundaries;
    c.model_fingerprint = scenario.empty() ? trace_file : scenario;
    c.microbatches = absl::GetFlag(FLAGS_microbatches);
    c.queue_capacity = static_cast<size_t>(absl::GetFlag(FLAGS_queue_capacity));
    if (per_node > 0) {  // its own connection to its node's relay
      c.shared_channel = nullptr;
      c.coordinator = relays.address(r / per_node);
      c.channel = agent::ChannelOptions{};
      c.channel.index = r;
      c.token.clear();
    }
    if (per_session == 1) {
      absl::StatusOr<std::unique_ptr<agent::Agent>> a = agent::Agent::Start(c);
      if (!a.ok()) return Die(std::string(a.status().message()));
      single.push_back(*std::move(a));
      ranks.push_back(single.back().get());
      continue;
    }
    pending_host.push_back(c);
    if (static_cast<int>(pending_host.size()) < per_session) continue;
    agent::HostAgentConfig hc;
    hc.shared_channel = pending_host.front().shared_channel;
    hc.token = token;
    hc.host = absl::StrCat(absl::GetFlag(FLAGS_host_prefix), "session-",
                           r / per_session);
    hc.ranks = std::move(pending_host);
    pending_host.clear();
    absl::StatusOr<std::unique_ptr<agent::HostAgent>> h =
        agent::HostAgent::Start(hc);
    if (!h.ok()) return Die(std::string(h.status().message()));
    hosts.push_back(*std::move(h));
    for (size_t i = 0; i < hosts.back()->size(); ++i) {
      ranks.push_back(&hosts.back()->rank(i));
    }
  }
  const absl::Time connect_deadline =
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_connect_timeout_s));
  for (auto& a : ranks) {
    if (!a->WaitConnected(connect_deadline - absl::Now())) {
      return Die(absl::StrCat("not every agent connected within ",
                              absl::GetFlag(FLAGS_connect_timeout_s),
                              "s: ", a->stats().last_error));
    }
  }

  const absl::Duration pace = absl::Milliseconds(absl::GetFlag(FLAGS_iteration_ms));
  nlohmann::json plans = nlohmann::json::array();
  std::vector<double> delivery_ms;
  int applied = 0, failed = 0;
  uint64_t applied_epoch = 0;
  const absl::Time start = absl::Now();
  absl::Time next = start;
  for (int k = 0; k < iterations; ++k) {
    // Plans due at k: the in-band agreement over every active rank.
    std::vector<std::optional<wire::Plan>> due(ranks.size());
    bool any = false;
    bool all = true;
    uint64_t epoch = 0;
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (std::find(active.begin(), active.end(),
                    static_cast<int>(r) % stages) == active.end()) {
        continue;
      }
      due[r] = ranks[r]->PlanToApplyAt(k);
      if (due[r]) {
        any = true;
        if (epoch == 0) epoch = due[r]->epoch;
        all = all && due[r]->epoch == epoch;
      } else {
        all = false;
      }
    }
    if (any) {
      const wire::Plan plan = *std::find_if(due.begin(), due.end(),
                                          [](const auto& p) { return p.has_value(); })
                                 ->operator->();
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (due[r]) {
          (void)ranks[r]->Acknowledge(due[r]->epoch, all,
                                      all ? "" : "not every rank committed");
        }
      }
      nlohmann::json pj = {{"epoch", plan.epoch},
                           {"apply_iteration", plan.apply_iteration},
                           {"reason", plan.reason},
                           {"applied", all}};
      if (all) {
        ++applied;
        applied_epoch = plan.epoch;
        boundaries = plan.boundaries;
        active = plan.active_stages;
        int64_t last_commit = 0;
        std::vector<double> prep_ms, com_ms;
        for (size_t r = 0; r < ranks.size(); ++r) {
          if (!due[r]) continue;
          agent::AgentStats st = ranks[r]->stats();
          if (st.last_commit_epoch == plan.epoch) {
            last_commit = std::max(last_commit, st.last_commit_unix_nanos);
            com_ms.push_back((st.last_commit_unix_nanos - plan.decided_unix_nanos) / 1e6);
          }
          if (st.last_prepare_epoch == plan.epoch) {
            prep_ms.push_back((st.last_prepare_unix_nanos - plan.decided_unix_nanos) / 1e6);
          }
        }
        // Spread over the ranks (ms after the decision): when each got the
        // PREPARE and when each held the plan committed.
        pj["prepare_ms_min_p50_max"] = {Percentile(prep_ms, 0), Percentile(prep_ms, 0.5), Percentile(prep_ms, 1)};
        pj["commit_ms_min_p50_max"] = {Percentile(com_ms, 0), Percentile(com_ms, 0.5), Percentile(com_ms, 1)};
        const double ms =
            static_cast<double>(last_commit - plan.decided_unix_nanos) / 1e6;
        delivery_ms.push_back(ms);
        pj["delivery_ms"] = ms;
        pj["boundaries"] = boundaries;
        pj["released_stages"] = plan.released_stages;
      } else {
        ++failed;
      }
      plans.push_back(pj);
    }

    // Every active rank reports record k of its stage's layers, spread over
    // --threads threads (one trainer thread per rank in real life).
    const core::TraceRecord& rec = trace[static_cast<size_t>(k) % trace.size()];
    // The simulated step time every rank reports (its realized-gain input):
    // the slowest active stage's layers, the pipeline's pace.
    double step_s = 0;
    for (size_t i = 0; i + 1 < boundaries.size(); ++i) {
      double stage_s = 0;
      for (int l = boundaries[i]; l < boundaries[i + 1]; ++l) {
        const core::TraceLayer& tl = rec.layers[static_cast<size_t>(l)];
        stage_s += tl.fwd_s + tl.bwd_s + tl.wgrad_s;
      }
      step_s = std::max(step_s, stage_s);
    }
    const int nthreads = std::max(1, absl::GetFlag(FLAGS_threads));
    std::vector<std::thread> workers;
    std::vector<std::string> errors(static_cast<size_t>(nthreads));
    for (int t = 0; t < nthreads; ++t) {
      workers.emplace_back([&, t] {
    for (size_t r = static_cast<size_t>(t); r < ranks.size();
         r += static_cast<size_t>(nthreads)) {
      const int stage = static_cast<int>(r) % stages;
      auto it = std::find(active.begin(), active.end(), stage);
      if (it == active.end()) continue;
      const size_t idx = static_cast<size_t>(it - active.begin());
      agent::IterationSample s;
      s.iteration = k;
      s.iteration_s = step_s;
      for (int l = boundaries[idx]; l < boundaries[idx + 1]; ++l) {
        const core::TraceLayer& tl = rec.layers[static_cast<size_t>(l)];
        core::LayerCost c;
        c.id = l;
        c.fwd_s = tl.fwd_s;
        c.bwd_s = tl.bwd_s;
        c.wgrad_s = tl.wgrad_s;
        c.resident_bytes = tl.mem_bytes;
        s.layers.push_back(c);
      }
      if (absl::Status st = ranks[r]->ReportIteration(s); !st.ok()) {
        errors[static_cast<size_t>(t)] = absl::StrCat("rank ", r, ": ", st.message());
        return;
      }
    }
      });
    }
    for (auto& w : workers) w.join();
    for (const auto& e : errors) {
      if (!e.empty()) return Die(e);
    }
    next += pace;
    absl::SleepFor(next - absl::Now());
  }
  const double run_s = absl::ToDoubleSeconds(absl::Now() - start);
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_drain_s)));

  int64_t sent = 0, dropped = 0, connects = 0;
  std::string last_error;
  std::map<std::string, int> prepared_epochs;  // newest PREPARE seen -> ranks
  for (auto& a : ranks) {
    agent::AgentStats st = a->stats();
    ++prepared_epochs[absl::StrCat(st.last_prepare_epoch)];
    if (!st.last_error.empty()) last_error = st.last_error;
    sent += st.reports_sent;
    dropped += st.samples_dropped;
    connects += st.connects;
  }
  const nlohmann::json relay_totals = relays.Totals();
  for (auto& a : single) a->Stop();
  for (auto& h : hosts) h->Stop();
  relays.Stop();

  const core::TraceRecord& last =
      trace[static_cast<size_t>(iterations - 1) % trace.size()];
  nlohmann::json out = {
      {"job", absl::GetFlag(FLAGS_job)},
      {"agents", agents},
      {"ranks_per_session", per_session},
      {"relay_ranks_per_node", per_node},
      {"sessions", per_node > 0 ? agents / per_node : agents / per_session},
      {"ranks_by_newest_prepare", prepared_epochs},
      {"stages", stages},
      {"replicas", dp},
      {"layers", num_layers},
      {"iterations", iterations},
      {"run_seconds", run_s},
      {"reports_sent", sent},
      {"reports_per_second", run_s > 0 ? static_cast<double>(sent) / run_s : 0},
      {"samples_dropped", dropped},
      {"connects", connects},
      {"last_agent_error", last_error},
      {"plans_applied", applied},
      {"plans_failed", failed},
      {"applied_epoch", applied_epoch},
      {"plan_delivery_ms_p50", Percentile(delivery_ms, 0.5)},
      {"plan_delivery_ms_p99", Percentile(delivery_ms, 0.99)},
      {"plan_delivery_ms_max", Percentile(delivery_ms, 1.0)},
      {"initial_boundaries", initial_boundaries},
      {"final_boundaries", boundaries},
      {"active_stages", active},
      {"initial_layout_imbalance", clients::ImbalanceOf(last, initial_boundaries)},
      {"final_imbalance",
       boundaries.size() >= 2 ? clients::ImbalanceOf(last, boundaries) : 0.0},
      {"plans", plans}};
  out.update(relay_totals);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
