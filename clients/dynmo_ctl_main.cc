// dynmo-ctl: the operator's and scheduler's command line for a running
// coordinator.
//
//   dynmo-ctl --coordinator ADDR jobs
//   dynmo-ctl --coordinator ADDR job NAME
//   dynmo-ctl --coordinator ADDR plans NAME
//   dynmo-ctl --coordinator ADDR released [--all]
//   dynmo-ctl --coordinator ADDR placements [NAME]
//   dynmo-ctl --coordinator ADDR claim ID... --holder WHO [--lease_seconds N]
//   dynmo-ctl --coordinator ADDR return ID... --holder WHO
//   dynmo-ctl --coordinator ADDR rebalance NAME
//   dynmo-ctl --coordinator ADDR delete NAME [--force] [--release_name]
//   dynmo-ctl --coordinator ADDR policy NAME [--balancer B] [--trigger T]
//             [--repack] [--repack_tolerance X] [--elastic release|reshape]
//
// A secured coordinator: --coordinator_token_file, --coordinator_tls_ca,
// --coordinator_tls_cert / _key, --coordinator_tls_server_name (the flags
// every client shares, cli/coordinator_flags.h).
//
// A readable table by default; --json prints the response message as JSON
// (protobuf's canonical mapping). Exit status 0 on success, 1 on an RPC
// error (its code and message on stderr), 2 on a usage error.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "agent/channel.h"
#include "agent/client_credentials.h"
#include "cli/address.h"
#include "core/realized_gain.h"
#include "cli/coordinator_flags.h"
#include "cli/flag_parse.h"
#include "cli/program_info.h"
#include "dynmo/v1/operator.grpc.pb.h"
#include "dynmo/v1/scheduler.grpc.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/client_context.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "coordinator address");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(std::string, holder, "", "claim/return: the lease holder");
ABSL_FLAG(int64_t, lease_seconds, 3600, "claim: lease length");
ABSL_FLAG(bool, all, false, "released: include claimed GPUs");
ABSL_FLAG(std::string, balancer, "", "policy: balancer");
ABSL_FLAG(std::string, trigger, "", "policy: trigger");
ABSL_FLAG(bool, repack, false, "policy: enable re-packing");
ABSL_FLAG(double, repack_tolerance, 0, "policy: re-packing tolerance");
ABSL_FLAG(std::string, elastic, "",
          "policy: what re-packing does with freed ranks: release | reshape");
ABSL_FLAG(double, timeout_s, 10, "RPC deadline");
ABSL_FLAG(bool, force, false,
          "delete: also a job with connected ranks (their sessions end)");
ABSL_FLAG(bool, release_name, false,
          "delete: also give up the job's name (else it stays its owner's)");

namespace {

using namespace dynmo;

std::string token;

void Prepare(grpc::ClientContext* ctx) {
  ctx->set_deadline(absl::ToChronoTime(
      absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_s))));
  agent::AddBearerToken(ctx, token);
}

int Fail(const char* what, const grpc::Status& s) {
  std::fprintf(stderr, "dynmo-ctl: %s: %s (code %d)\n", what,
               s.error_message().c_str(), static_cast<int>(s.error_code()));
  return 1;
}

// A bad command line: one line, exit 2.
int Usage(const std::string& why) { return cli::BadCommandLine("dynmo-ctl", why); }

// The flags' values a typo or a sign error makes meaningless; empty when
// all are in range.
std::string BadFlagValues() {
  const double timeout = absl::GetFlag(FLAGS_timeout_s);
  if (!(std::isfinite(timeout) && timeout > 0 && timeout <= 1e6)) {
    return "--timeout_s must be in (0, 1e6] seconds";
  }
  const int64_t lease = absl::GetFlag(FLAGS_lease_seconds);
  if (lease <= 0 || lease > 365LL * 24 * 3600) {
    return "--lease_seconds must be in (0, one year]";
  }
  if (absl::Status s = cli::CheckAddress("coordinator", absl::GetFlag(FLAGS_coordinator));
      !s.ok()) {
    return std::string(s.message());
  }
  return "";
}

void PrintJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  std::printf("%s", out.c_str());
  if (out.empty() || out.back() != '\n') std::printf("\n");
}

const char* Outcome(v1::PlanOutcome o) {
  switch (o) {
    case v1::PLAN_OUTCOME_PREPARING: return "preparing";
    case v1::PLAN_OUTCOME_COMMITTED: return "committed";
    case v1::PLAN_OUTCOME_APPLIED: return "applied";
    case v1::PLAN_OUTCOME_ABORTED: return "aborted";
    default: return "?";
  }
}

std::string Ints(const google::protobuf::RepeatedField<int32_t>& v) {
  return absl::StrJoin(v, ",");
}

void PrintJobsTable(const v1::ListJobsResponse& r) {
  std::printf("%-20s %6s %4s %6s %7s %7s %10s %9s %12s %-9s %s\n", "JOB",
              "STAGES", "DP", "LAYERS", "RANKS", "EPOCH", "ITERATION",
              "IMBALANCE", "BOTTLENECK_S", "PLAN", "TRIGGER");
  for (const auto& j : r.jobs()) {
    std::printf("%-20s %3d/%-2d %4d %6d %3d/%-3d %3llu/%-3llu %10lld %9.4f %12.6f %-9s %s\n",
                j.name().c_str(), j.active_stages(), j.pipeline_size(),
                j.data_parallel_size(), j.num_layers(), j.connected_ranks(),
                j.pipeline_size() * j.data_parallel_size(),
                static_cast<unsigned long long>(j.applied_epoch()),
                static_cast<unsigned long long>(j.epoch()),
                static_cast<long long>(j.last_iteration()), j.imbalance(),
                j.bottleneck_s(), j.plan_state().c_str(),
                j.policy().trigger().c_str());
  }
}

// A plan's realized gain as a percentage, "-" until it was measured; "*"
// when the model changed inside the measurement.
std::string Realized(const v1::PlanRecord& h) {
  if (h.realized_samples() <= 0) return "-";
  return absl::StrFormat("%+.1f%%%s", 100 * h.realized_gain(),
                         h.realized_model_changed() ? "*" : "");
}

void PrintPlans(const v1::JobStatus& st) {
  std::printf("%6s %-10s %10s %-22s %12s %12s %9s %9s %10s %s\n", "EPOCH", "OUTCOME",
              "APPLY_AT", "REASON", "BEFORE_S", "AFTER_S", "PREDICTED", "REALIZED",
              "MOVED_B", "BOUNDARIES / RELEASED");
  for (const auto& h : st.history()) {
    const auto& p = h.plan();
    std::printf("%6llu %-10s %10lld %-22s %12.6f %12.6f %+8.1f%% %9s %10lld [%s]%s%s\n",
                static_cast<unsigned long long>(p.epoch()), Outcome(h.outcome()),
                static_cast<long long>(p.apply_iteration()), p.reason().c_str(),
                p.previous_bottleneck_s(), p.predicted_bottleneck_s(),
                100 * h.predicted_gain(), Realized(h).c_str(),
                static_cast<long long>(p.migration_bytes()),
                Ints(p.boundaries()).c_str(),
                p.released_stages_size() > 0
                    ? absl::StrCat(" released stages ",
                                   Ints(p.released_stages()))
                          .c_str()
                    : "",
                h.detail().empty() ? "" : absl::StrCat("  (", h.detail(), ")").c_str());
  }
}

void PrintJob(const v1::JobStatus& st) {
  const auto& s = st.summary();
  std::printf("job            %s\n", s.name().c_str());
  std::printf("shape          %d stages x %d replicas, %d layers\n",
              s.pipeline_size(), s.data_parallel_size(), s.num_layers());
  std::printf("ranks          %d connected\n", s.connected_ranks());
  std::printf("epoch          applied %llu, issued %llu, plan %s\n",
              static_cast<unsigned long long>(s.applied_epoch()),
              static_cast<unsigned long long>(s.epoch()),
              s.plan_state().c_str());
  // How well the plans kept their word (the auto gate's calibration).
  std::vector<double> errors;
  int across_change = 0;
  for (const auto& h : st.history()) {
    if (h.realized_samples() <= 0) continue;
    if (h.realized_model_changed()) {
      ++across_change;
    } else {
      errors.push_back(std::fabs(h.realized_gain() - h.predicted_gain()));
    }
  }
  if (!errors.empty()) {
    std::printf("predictions    %zu plans measured, median error %.1f points\n",
                errors.size(), 100 * core::Median(errors));
  }
  if (across_change > 0) {
    std::printf("               %d more measured across a model change (* in plans), "
                "not counted\n",
                across_change);
  }
  std::printf("iteration      %lld (%lld reports)\n",
              static_cast<long long>(s.last_iteration()),
              static_cast<long long>(s.reports()));
  std::printf("policy         balancer=%s trigger=%s repack=%s tolerance=%g elastic=%s\n",
              s.policy().balancer().c_str(), s.policy().trigger().c_str(),
              s.policy().repack() ? "on" : "off", s.policy().repack_tolerance(),
              s.policy().elastic().c_str());
  std::printf("active stages  [%s]\n", Ints(st.active_stages()).c_str());
  std::printf("boundaries     [%s]\n", Ints(st.boundaries()).c_str());
  std::printf("stage loads    [%s] s\n",
              absl::StrJoin(st.stage_load_s(), ", ",
                            [](std::string* out, double v) {
                              absl::StrAppend(out, absl::StrFormat("%.6f", v));
                            })
                  .c_str());
  std::printf("imbalance      %.4f\n", s.imbalance());
  std::printf("bottleneck     %.6f s (lower bound %.6f s)\n", s.bottleneck_s(),
              st.lower_bound_s());
  std::printf("bubble ratio   %.4f (predicted)\n", st.predicted_bubble_ratio());
  if (st.rank_speed_size() > 0) {
    // The slowest rank paces its stage (and, with data parallelism, every
    // replica at the all-reduce).
    int slowest = 0;
    for (int r = 1; r < st.rank_speed_size(); ++r) {
      if (st.rank_speed(r) < st.rank_speed(slowest)) slowest = r;
    }
    std::printf("rank speeds    [%s] (slowest: rank %d at %.3f)\n",
                absl::StrJoin(st.rank_speed(), ", ",
                              [](std::string* out, double v) {
                                absl::StrAppend(out, absl::StrFormat("%.3f", v));
                              })
                    .c_str(),
                slowest, st.rank_speed(slowest));
  }
  std::printf("plans          %d in history\n", st.history_size());
  if (!st.note().empty()) std::printf("note           %s\n", st.note().c_str());
}

void PrintGpus(const google::protobuf::RepeatedPtrField<v1::ReleasedGpu>& gpus) {
  std::printf("%-10s %-16s %-16s %6s %5s %5s %6s %-8s %-16s %s\n", "ID", "JOB",
              "HOST", "DEVICE", "RANK", "STAGE", "EPOCH", "STATE", "HOLDER",
              "RELEASED");
  for (const auto& g : gpus) {
    std::printf("%-10s %-16s %-16s %6d %5d %5d %6llu %-8s %-16s %s\n",
                g.id().c_str(), g.job().c_str(), g.host().c_str(), g.device(),
                g.rank(), g.stage(), static_cast<unsigned long long>(g.epoch()),
                g.state() == v1::ReleasedGpu::CLAIMED ? "claimed" : "free",
                g.holder().c_str(),
                absl::FormatTime("%Y-%m-%dT%H:%M:%SZ",
                                 absl::FromUnixMillis(g.released_unix_ms()),
                                 absl::UTCTimeZone())
                    .c_str());
  }
}

void PrintPlacements(const google::protobuf::RepeatedPtrField<v1::GpuPlacement>& where) {
  std::printf("%-16s %5s %-16s %6s %5s %7s %6s\n", "JOB", "RANK", "HOST", "DEVICE",
              "STAGE", "REPLICA", "EPOCH");
  for (const auto& p : where) {
    std::printf("%-16s %5d %-16s %6d %5s %7s %6llu\n", p.job().c_str(), p.rank(),
                p.host().c_str(), p.device(),
                p.released() ? "-" : absl::StrCat(p.stage()).c_str(),
                p.released() ? "released" : absl::StrCat(p.replica()).c_str(),
                static_cast<unsigned long long>(p.epoch()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "dynmo-ctl --coordinator ADDR [--json] "
      "{jobs | job NAME | plans NAME | released [--all] | placements [NAME] | "
      "claim ID... --holder WHO [--lease_seconds N] | "
      "return ID... --holder WHO | rebalance NAME | delete NAME [--force] [--release_name] | "
      "policy NAME [--balancer B] [--trigger T] [--repack] "
      "[--repack_tolerance X] [--elastic release|reshape]}");
  if (dynmo::cli::HandleHelpOrVersion(argc, argv, "dynmo-ctl",
                                       absl::ProgramUsageMessage())) {
    return 0;
  }
  std::vector<char*> pos = cli::ParseFlagsOrExit(argc, argv, "dynmo-ctl");
  if (pos.size() < 2) return Usage("missing command");
  if (std::string bad = BadFlagValues(); !bad.empty()) return Usage(bad);
  const std::string cmd = pos[1];
  std::vector<std::string> args(pos.begin() + 2, pos.end());
  const bool json = absl::GetFlag(FLAGS_json);

  // Token and TLS: the --coordinator_* flags every client shares.
  absl::StatusOr<cli::CoordinatorClientFlags> client = cli::ReadCoordinatorClientFlags();
  if (!client.ok()) return Usage(std::string(client.status().message()));
  absl::StatusOr<agent::ClientCredentials> credentials = agent::CredentialsFrom(*client);
  if (!credentials.ok()) return Usage(std::string(credentials.status().message()));
  token = credentials->token;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      agent::MakeChannel(absl::GetFlag(FLAGS_coordinator), credentials->channel);
  if (!channel.ok()) return Usage(std::string(channel.status().message()));
  auto ops = v1::OperatorService::NewStub(*channel);
  auto sched = v1::SchedulerService::NewStub(*channel);

  auto need_one = [&](const char* what) {
    return args.size() == 1 ? 0 : Usage(absl::StrCat(cmd, " takes one ", what));
  };

  if (cmd == "jobs") {
    if (!args.empty()) return Usage("jobs takes no arguments");
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::ListJobsResponse r;
    grpc::Status s = ops->ListJobs(&ctx, v1::ListJobsRequest(), &r);
    if (!s.ok()) return Fail("jobs", s);
    json ? PrintJson(r) : PrintJobsTable(r);
    return 0;
  }
  if (cmd == "job" || cmd == "plans") {
    if (int rc = need_one("job name")) return rc;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::GetJobRequest req;
    req.set_job(args[0]);
    v1::JobStatus st;
    grpc::Status s = ops->GetJob(&ctx, req, &st);
    if (!s.ok()) return Fail(cmd.c_str(), s);
    if (json) {
      if (cmd == "plans") {
        v1::JobStatus only;
        *only.mutable_history() = st.history();
        PrintJson(only);
      } else {
        PrintJson(st);
      }
    } else {
      cmd == "job" ? PrintJob(st) : PrintPlans(st);
    }
    return 0;
  }
  if (cmd == "released") {
    if (!args.empty()) return Usage("released takes no arguments");
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::ListReleasedRequest req;
    req.set_include_claimed(absl::GetFlag(FLAGS_all));
    v1::ListReleasedResponse r;
    grpc::Status s = sched->ListReleased(&ctx, req, &r);
    if (!s.ok()) return Fail("released", s);
    json ? PrintJson(r) : PrintGpus(r.gpus());
    return 0;
  }
  if (cmd == "placements") {
    if (args.size() > 1) return Usage("placements takes at most one job name");
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::ListPlacementsRequest req;
    if (!args.empty()) req.set_job(args[0]);
    v1::ListPlacementsResponse r;
    grpc::Status s = sched->ListPlacements(&ctx, req, &r);
    if (!s.ok()) return Fail("placements", s);
    json ? PrintJson(r) : PrintPlacements(r.placements());
    return 0;
  }
  if (cmd == "claim" || cmd == "return") {
    if (args.empty()) return Usage(absl::StrCat(cmd, " needs GPU ids"));
    if (absl::GetFlag(FLAGS_holder).empty()) {
      return Usage(absl::StrCat(cmd, " needs --holder"));
    }
    grpc::ClientContext ctx;
    Prepare(&ctx);
    grpc::Status s;
    google::protobuf::RepeatedPtrField<v1::ReleasedGpu> gpus;
    if (cmd == "claim") {
      v1::ClaimRequest req;
      for (const auto& a : args) req.add_ids(a);
      req.set_holder(absl::GetFlag(FLAGS_holder));
      req.set_lease_seconds(absl::GetFlag(FLAGS_lease_seconds));
      v1::ClaimResponse r;
      s = sched->Claim(&ctx, req, &r);
      if (s.ok() && json) PrintJson(r);
      gpus = r.gpus();
    } else {
      v1::ReturnRequest req;
      for (const auto& a : args) req.add_ids(a);
      req.set_holder(absl::GetFlag(FLAGS_holder));
      v1::ReturnResponse r;
      s = sched->Return(&ctx, req, &r);
      if (s.ok() && json) PrintJson(r);
      gpus = r.gpus();
    }
    if (!s.ok()) return Fail(cmd.c_str(), s);
    if (!json) PrintGpus(gpus);
    return 0;
  }
  if (cmd == "rebalance") {
    if (int rc = need_one("job name")) return rc;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::RebalanceRequest req;
    req.set_job(args[0]);
    v1::RebalanceResponse r;
    grpc::Status s = ops->Rebalance(&ctx, req, &r);
    if (!s.ok()) return Fail("rebalance", s);
    if (json) {
      PrintJson(r);
    } else {
      std::printf("%s\n", r.detail().c_str());
    }
    return 0;
  }
  if (cmd == "delete") {
    if (int rc = need_one("job name")) return rc;
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::DeleteJobRequest req;
    req.set_job(args[0]);
    req.set_force(absl::GetFlag(FLAGS_force));
    req.set_release_name(absl::GetFlag(FLAGS_release_name));
    v1::DeleteJobResponse r;
    grpc::Status s = ops->DeleteJob(&ctx, req, &r);
    if (!s.ok()) return Fail("delete", s);
    if (json) {
      PrintJson(r);
    } else {
      std::printf("job %s deleted (%d sessions ended)\n", args[0].c_str(),
                  r.closed_sessions());
    }
    return 0;
  }
  if (cmd == "policy") {
    if (int rc = need_one("job name")) return rc;
    // Only what is given changes: the rest is the job's current policy
    // (proto3 booleans and numbers cannot say "not given").
    v1::SetPolicyRequest req;
    req.set_job(args[0]);
    {
      grpc::ClientContext get_ctx;
      Prepare(&get_ctx);
      v1::GetJobRequest get;
      get.set_job(args[0]);
      v1::JobStatus current;
      if (grpc::Status g = ops->GetJob(&get_ctx, get, &current); !g.ok()) {
        return Fail("policy", g);
      }
      *req.mutable_policy() = current.summary().policy();
    }
    // Whether the command line set --name (this absl cannot say).
    auto given = [argc, argv](absl::string_view name) {
      for (int i = 1; i < argc; ++i) {
        absl::string_view a = argv[i];
        if (a == "--") break;
        if (!absl::ConsumePrefix(&a, "--")) absl::ConsumePrefix(&a, "-");
        if (a == name || absl::StartsWith(a, absl::StrCat(name, "=")) ||
            a == absl::StrCat("no", name)) {
          return true;
        }
      }
      return false;
    };
    if (given("balancer")) req.mutable_policy()->set_balancer(absl::GetFlag(FLAGS_balancer));
    if (given("trigger")) req.mutable_policy()->set_trigger(absl::GetFlag(FLAGS_trigger));
    if (given("repack")) req.mutable_policy()->set_repack(absl::GetFlag(FLAGS_repack));
    if (given("repack_tolerance")) {
      req.mutable_policy()->set_repack_tolerance(absl::GetFlag(FLAGS_repack_tolerance));
    }
    if (given("elastic")) req.mutable_policy()->set_elastic(absl::GetFlag(FLAGS_elastic));
    grpc::ClientContext ctx;
    Prepare(&ctx);
    v1::SetPolicyResponse r;
    grpc::Status s = ops->SetPolicy(&ctx, req, &r);
    if (!s.ok()) return Fail("policy", s);
    if (json) {
      PrintJson(r);
    } else {
      std::printf("balancer=%s trigger=%s repack=%s tolerance=%g elastic=%s\n",
                  r.policy().balancer().c_str(), r.policy().trigger().c_str(),
                  r.policy().repack() ? "on" : "off",
                  r.policy().repack_tolerance(), r.policy().elastic().c_str());
    }
    return 0;
  }
  return Usage(absl::StrCat("unknown command '", cmd, "'"));
}
