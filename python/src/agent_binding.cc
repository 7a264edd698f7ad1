#include "python/src/agent_binding.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/agent_config.h"
#include "agent/operator_client.h"
#include "core/probe_cadence.h"
#include "pybind11/stl.h"
#include "python/src/status_error.h"
#include "wire/plan_codec.h"

namespace dynmo::python {
namespace {

namespace py = pybind11;
using agent::Agent;
using agent::AgentConfig;

// (layer, fwd_s, bwd_s, wgrad_s, params, resident_bytes, activation_bytes)
using LayerTuple = std::tuple<int, double, double, double, int64_t, int64_t, int64_t>;

// A duration in seconds from Python: finite and >= 0, else INVALID_ARGUMENT.
absl::Duration Seconds(double s, const char* what) {
  if (!std::isfinite(s) || s < 0) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat(what, " must be finite and >= 0 seconds, got ", s)));
  }
  return absl::Seconds(s);
}

py::dict PlanToDict(const wire::Plan& p) {
  py::list migrations;
  for (const core::LayerMigration& m : p.migrations) {
    py::dict d;
    d["layer"] = m.layer;
    d["from_stage"] = m.from_stage;
    d["to_stage"] = m.to_stage;
    d["bytes"] = m.bytes;
    d["round"] = m.round;
    migrations.append(d);
  }
  py::list split;
  for (const core::CommSplit& c : p.split) {
    py::dict d;
    d["stage"] = c.stage;
    d["color"] = c.color;
    d["key"] = c.key;
    split.append(d);
  }
  py::dict d;
  d["job"] = p.job;
  d["epoch"] = p.epoch;
  d["apply_iteration"] = p.apply_iteration;
  d["boundaries"] = p.boundaries;
  d["active_stages"] = p.active_stages;
  d["released_stages"] = p.released_stages;
  d["migrations"] = migrations;
  d["split"] = split;
  d["migration_bytes"] = p.migration_bytes;
  d["predicted_bottleneck_s"] = p.predicted_bottleneck_s;
  d["previous_bottleneck_s"] = p.previous_bottleneck_s;
  d["reason"] = p.reason;
  d["decided_unix_nanos"] = p.decided_unix_nanos;
  d["commit_with_prepare"] = p.commit_with_prepare;
  if (p.reshape) {
    py::dict r;
    r["pipeline_size"] = p.reshape->pipeline_size;
    r["data_parallel_size"] = p.reshape->data_parallel_size;
    r["copy_bytes"] = p.reshape->copy_bytes;
    d["reshape"] = r;
  } else {
    d["reshape"] = py::none();
  }
  return d;
}

py::object OptionalPlan(std::optional<wire::Plan> plan) {
  if (!plan) return py::none();
  return PlanToDict(*plan);
}

py::dict StatsToDict(const agent::AgentStats& s) {
  py::dict d;
  d["connected"] = s.connected;
  d["applied_epoch"] = s.applied_epoch;
  d["boundaries"] = s.boundaries;
  d["active_stages"] = s.active_stages;
  d["released"] = s.released;
  d["reports_sent"] = s.reports_sent;
  d["samples_dropped"] = s.samples_dropped;
  d["connects"] = s.connects;
  d["plans_prepared"] = s.plans_prepared;
  d["plans_applied"] = s.plans_applied;
  d["plans_failed"] = s.plans_failed;
  d["last_commit_epoch"] = s.last_commit_epoch;
  d["last_commit_unix_nanos"] = s.last_commit_unix_nanos;
  d["last_prepare_epoch"] = s.last_prepare_epoch;
  d["last_prepare_unix_nanos"] = s.last_prepare_unix_nanos;
  d["last_error"] = s.last_error;
  d["gave_up"] = s.gave_up;
  return d;
}

// An Agent method that waits up to a timeout, as a Python method taking
// seconds and waiting without the GIL.
auto Waiting(bool (Agent::*wait)(absl::Duration) const) {
  return [wait](const Agent& a, double timeout_s) {
    const absl::Duration timeout = Seconds(timeout_s, "timeout_s");
    py::gil_scoped_release release;
    return (a.*wait)(timeout);
  };
}

std::unique_ptr<Agent> StartAgent(const AgentConfig& config) {
  absl::StatusOr<std::unique_ptr<Agent>> agent;
  {
    py::gil_scoped_release release;
    agent = Agent::Start(config);
  }
  ThrowIfError(agent.status());
  return *std::move(agent);
}

void Report(Agent& agent, int64_t iteration, const std::vector<LayerTuple>& layers,
            int64_t memory_used_bytes, int64_t memory_capacity_bytes,
            double neighbour_wait_s, bool model_changed, double probe_s, double exchange_s,
            double iteration_s) {
  agent::IterationSample sample;
  sample.iteration = iteration;
  for (const LayerTuple& t : layers) {
    core::LayerCost c;
    std::tie(c.id, c.fwd_s, c.bwd_s, c.wgrad_s, c.params, c.resident_bytes,
             c.activation_bytes) = t;
    sample.layers.push_back(c);
  }
  sample.memory_used_bytes = memory_used_bytes;
  sample.memory_capacity_bytes = memory_capacity_bytes;
  sample.neighbour_wait_s = neighbour_wait_s;
  sample.model_changed = model_changed;
  sample.probe_s = probe_s;
  sample.exchange_s = exchange_s;
  sample.iteration_s = iteration_s;
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = agent.ReportIteration(sample);
  }
  ThrowIfError(status);
}

void SetPolicy(const std::string& address, const std::string& job,
               const std::string& balancer, const std::string& trigger,
               bool repack, double repack_tolerance, const std::string& elastic,
               const std::string& token, const agent::ChannelOptions& channel,
               double patience_s) {
  const absl::Duration patience = Seconds(patience_s, "patience_s");
  agent::JobPolicy policy;
  policy.balancer = balancer;
  policy.trigger = trigger;
  policy.repack = repack;
  policy.repack_tolerance = repack_tolerance;
  policy.elastic = elastic;
  absl::Status status;
  {
    py::gil_scoped_release release;
    absl::StatusOr<agent::OperatorClient> client =
        agent::OperatorClient::Connect(address, channel, token);
    status = client.ok() ? client->SetPolicy(job, policy, patience) : client.status();
  }
  ThrowIfError(status);
}

agent::ChannelOptions Channel(const std::string& tls_ca, const std::string& tls_cert,
                              const std::string& tls_key,
                              const std::string& tls_server_name) {
  agent::ChannelOptions c;
  c.tls_ca = tls_ca;
  c.tls_cert = tls_cert;
  c.tls_key = tls_key;
  c.tls_server_name = tls_server_name;
  return c;
}

}  // namespace

void BindAgent(py::module_& m) {
  py::class_<core::ProbeCadence>(
      m, "ProbeCadence",
      "core::ProbeCadence: when a rank runs the speed probe (each of its first "
      "`start_probes` iterations; watched: every `every` iterations; steady: every "
      "`steady_every`).")
      .def(py::init([](int every, int steady_every, int watch_probes, double min_change,
                       double sigmas, int confirmations, double smoothing, int start_probes) {
             core::ProbeCadenceOptions o;
             o.every = every;
             o.start_probes = start_probes;
             o.steady_every = steady_every;
             o.watch_probes = watch_probes;
             o.min_change = min_change;
             o.sigmas = sigmas;
             o.confirmations = confirmations;
             o.smoothing = smoothing;
             ThrowIfError(core::ValidateProbeCadenceOptions(o));
             return core::ProbeCadence(o);
           }),
           py::arg("every") = core::ProbeCadenceOptions{}.every,
           py::arg("steady_every") = core::ProbeCadenceOptions{}.steady_every,
           py::arg("watch_probes") = core::ProbeCadenceOptions{}.watch_probes,
           py::arg("min_change") = core::ProbeCadenceOptions{}.min_change,
           py::arg("sigmas") = core::ProbeCadenceOptions{}.sigmas,
           py::arg("confirmations") = core::ProbeCadenceOptions{}.confirmations,
           py::arg("smoothing") = core::ProbeCadenceOptions{}.smoothing,
           py::arg("start_probes") = core::ProbeCadenceOptions{}.start_probes)
      .def("should_probe", &core::ProbeCadence::ShouldProbe, py::arg("iteration"),
           py::arg("layer_seconds"), py::arg("layers_changed"),
           "Called once per iteration, in order: whether to run the probe now.")
      .def_property_readonly("watching", &core::ProbeCadence::watching);

  py::class_<AgentConfig>(m, "AgentConfig",
                          "agent::AgentConfig: what configures one rank's agent.")
      .def(py::init<>())
      .def_readwrite("coordinator", &AgentConfig::coordinator)
      .def_readwrite("token", &AgentConfig::token)
      .def_readwrite("job", &AgentConfig::job)
      .def_readwrite("rank", &AgentConfig::rank)
      .def_readwrite("pipeline_rank", &AgentConfig::pipeline_rank)
      .def_readwrite("data_parallel_rank", &AgentConfig::data_parallel_rank)
      .def_readwrite("pipeline_size", &AgentConfig::pipeline_size)
      .def_readwrite("data_parallel_size", &AgentConfig::data_parallel_size)
      .def_readwrite("host", &AgentConfig::host)
      .def_readwrite("device", &AgentConfig::device)
      .def_readwrite("memory_capacity_bytes", &AgentConfig::memory_capacity_bytes)
      .def_readwrite("num_layers", &AgentConfig::num_layers)
      .def_readwrite("boundaries", &AgentConfig::boundaries)
      .def_readwrite("model_fingerprint", &AgentConfig::model_fingerprint)
      .def_readwrite("microbatches", &AgentConfig::microbatches)
      .def_readwrite("schedule", &AgentConfig::schedule)
      .def_readwrite("planned_iterations", &AgentConfig::planned_iterations)
      .def_readwrite("queue_capacity", &AgentConfig::queue_capacity)
      .def_property(
          "tls_ca", [](const AgentConfig& c) { return c.channel.tls_ca; },
          [](AgentConfig& c, const std::string& v) { c.channel.tls_ca = v; })
      .def_property(
          "tls_cert", [](const AgentConfig& c) { return c.channel.tls_cert; },
          [](AgentConfig& c, const std::string& v) { c.channel.tls_cert = v; })
      .def_property(
          "tls_key", [](const AgentConfig& c) { return c.channel.tls_key; },
          [](AgentConfig& c, const std::string& v) { c.channel.tls_key = v; })
      .def_property(
          "tls_server_name",
          [](const AgentConfig& c) { return c.channel.tls_server_name; },
          [](AgentConfig& c, const std::string& v) { c.channel.tls_server_name = v; })
      .def_property(
          "initial_backoff_s",
          [](const AgentConfig& c) { return absl::ToDoubleSeconds(c.initial_backoff); },
          [](AgentConfig& c, double s) { c.initial_backoff = Seconds(s, "initial_backoff_s"); })
      .def_property(
          "max_backoff_s",
          [](const AgentConfig& c) { return absl::ToDoubleSeconds(c.max_backoff); },
          [](AgentConfig& c, double s) { c.max_backoff = Seconds(s, "max_backoff_s"); })
      .def_property(
          "rpc_timeout_s",
          [](const AgentConfig& c) { return absl::ToDoubleSeconds(c.rpc_timeout); },
          [](AgentConfig& c, double s) { c.rpc_timeout = Seconds(s, "rpc_timeout_s"); });

  py::class_<Agent>(m, "Agent", "agent::Agent: one rank's side of DynMo.")
      .def(py::init(&StartAgent), py::arg("config"),
           "Validates the config and starts the background thread (does not "
           "wait for the coordinator).")
      .def("report", &Report, py::arg("iteration"), py::arg("layers"),
           py::arg("memory_used_bytes") = 0, py::arg("memory_capacity_bytes") = 0,
           py::arg("neighbour_wait_s") = 0.0, py::arg("model_changed") = false,
           py::arg("probe_s") = 0.0, py::arg("exchange_s") = 0.0,
           py::arg("iteration_s") = 0.0,
           "Queues one iteration's sample; never blocks on the network.")
      .def(
          "plan_to_apply_at",
          [](Agent& a, int64_t iteration) {
            std::optional<wire::Plan> plan;
            {
              py::gil_scoped_release release;
              plan = a.PlanToApplyAt(iteration);
            }
            return OptionalPlan(std::move(plan));
          },
          py::arg("iteration"), "The committed plan due at `iteration`, or None.")
      .def(
          "latest_committed_plan",
          [](const Agent& a) {
            std::optional<wire::Plan> plan;
            {
              py::gil_scoped_release release;
              plan = a.LatestCommittedPlan();
            }
            return OptionalPlan(std::move(plan));
          },
          "The newest committed plan (waiting or applied), or None.")
      .def(
          "acknowledge",
          [](Agent& a, uint64_t epoch, bool applied, const std::string& detail) {
            absl::Status status;
            {
              py::gil_scoped_release release;
              status = a.Acknowledge(epoch, applied, detail);
            }
            ThrowIfError(status);
          },
          py::arg("epoch"), py::arg("applied"), py::arg("detail") = "",
          "Settles the plan of `epoch` (applied or not).")
      .def(
          "stats",
          [](const Agent& a) {
            agent::AgentStats s;
            {
              py::gil_scoped_release release;
              s = a.stats();
            }
            return StatsToDict(s);
          },
          "What the agent says about itself, as a dict.")
      .def("wait_connected", Waiting(&Agent::WaitConnected), py::arg("timeout_s"),
           "True once a session is open; False after timeout.")
      .def("flush", Waiting(&Agent::Flush), py::arg("timeout_s"),
           "True once every queued acknowledgement is written.")
      .def("stop", &Agent::Stop, py::call_guard<py::gil_scoped_release>(),
           "Stops the background thread (closes the session). Idempotent.");

  m.def(
      "set_policy",
      [](const std::string& address, const std::string& job,
         const std::string& balancer, const std::string& trigger, bool repack,
         double repack_tolerance, const std::string& elastic, const std::string& token,
         const std::string& tls_ca, const std::string& tls_cert, const std::string& tls_key,
         const std::string& tls_server_name, double patience_s) {
        SetPolicy(address, job, balancer, trigger, repack, repack_tolerance, elastic, token,
                  Channel(tls_ca, tls_cert, tls_key, tls_server_name), patience_s);
      },
      py::arg("address"), py::arg("job"), py::arg("balancer") = "",
      py::arg("trigger") = "", py::arg("repack") = false,
      py::arg("repack_tolerance") = 0.0, py::arg("elastic") = "", py::arg("token") = "",
      py::arg("tls_ca") = "", py::arg("tls_cert") = "", py::arg("tls_key") = "",
      py::arg("tls_server_name") = "", py::arg("patience_s") = 2.0,
      "Sets a job's balancer / trigger / re-packing / elastic mode (OperatorService).");
  m.def(
      "read_token",
      [](const std::string& path) {
        absl::StatusOr<std::string> token = agent::ReadToken(path);
        ThrowIfError(token.status());
        return *token;
      },
      py::arg("path"), "A bearer token file's contents, whitespace trimmed.");
}

}  // namespace dynmo::python
