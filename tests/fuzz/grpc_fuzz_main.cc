// dynmo-fuzz-grpc: hostile clients against a live coordinator. It serves a
// coordinator in-process with named principals, starts a canary job (two
// real Agents of principal "canary", reporting and holding their sessions),
// then sends --requests hostile calls from --clients concurrent threads as
// principal "attacker" (agent and scheduler roles), with no token, or with
// a wrong one: every RPC of the three services with random field values,
// sessions of other ranks with guessed keys, registrations into the canary
// job, and raw random bytes as request bodies (grpc::GenericStub). At the
// end the coordinator must still answer and the canary job must be exactly
// as it was. Prints one JSON line: requests by status code, whether the
// canary is unchanged. Exit 0 only when it is and nothing crashed.
//
//   dynmo-fuzz-grpc [--requests=10000] [--clients=4] [--seed=1]
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/agent.h"
#include "agent/channel.h"
#include "coordinator/service/embedded_coordinator.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "dynmo/v1/operator.grpc.pb.h"
#include "dynmo/v1/scheduler.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "nlohmann/json.hpp"

namespace {

using namespace dynmo;

constexpr char kCanaryToken[] = "canary-token-0123456789";
constexpr char kAttackerToken[] = "attacker-token-0123456789";
constexpr char kOpsToken[] = "ops-token-0123456789abc";

class Attacker {
 public:
  Attacker(std::shared_ptr<grpc::Channel> channel, uint64_t seed)
      : gen_(seed),
        agents_(v1::AgentService::NewStub(channel)),
        ops_(v1::OperatorService::NewStub(channel)),
        sched_(v1::SchedulerService::NewStub(channel)),
        generic_(channel) {}

  grpc::StatusCode One() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const uint64_t who = Next(10);
    agent::AddBearerToken(&ctx, who < 7 ? kAttackerToken : who < 9 ? "" : Text(24));
    switch (Next(14)) {
      case 0:
      case 1: {
        v1::RegisterRequest r = RandomRegister();
        v1::RegisterResponse resp;
        return agents_->Register(&ctx, r, &resp).error_code();
      }
      case 2: {
        v1::RegisterHostRequest r;
        const int n = static_cast<int>(Next(5));
        for (int i = 0; i < n; ++i) *r.add_ranks() = RandomRegister();
        v1::RegisterHostResponse resp;
        return agents_->RegisterHost(&ctx, r, &resp).error_code();
      }
      case 3:
      case 4: {
        auto stream = agents_->Session(&ctx);
        v1::AgentMessage hello;
        hello.mutable_hello()->set_job(Next(2) ? "canary" : Name());
        hello.mutable_hello()->set_rank(static_cast<int>(Next(4)) - 1);
        hello.mutable_hello()->set_session_key(Next(2) ? Text(32) : "");
        stream->Write(hello);
        const int n = static_cast<int>(Next(4));
        for (int i = 0; i < n; ++i) {
          v1::AgentMessage m;
          if (Next(2)) {
            *m.mutable_report() = RandomReport();
          } else {
            m.mutable_ack()->set_epoch(Next(1000));
            m.mutable_ack()->set_state(static_cast<v1::PlanAck::State>(Next(5)));
          }
          if (!stream->Write(m)) break;
        }
        stream->WritesDone();
        v1::CoordinatorMessage in;
        while (stream->Read(&in)) {
        }
        return stream->Finish().error_code();
      }
      case 5: {
        auto stream = agents_->HostSession(&ctx);
        v1::HostMessage hello;
        hello.mutable_hello()->set_job(Next(2) ? "canary" : Name());
        hello.mutable_hello()->set_host(Text(8));
        for (int i = 0, n = static_cast<int>(Next(4)); i < n; ++i) {
          hello.mutable_hello()->add_ranks(static_cast<int>(Next(4)));
          hello.mutable_hello()->add_session_keys(Text(32));
        }
        stream->Write(hello);
        stream->WritesDone();
        v1::HostCoordinatorMessage in;
        while (stream->Read(&in)) {
        }
        return stream->Finish().error_code();
      }
      case 6: {
        v1::SetPolicyRequest r;
        r.set_job(Next(2) ? "canary" : Name());
        r.mutable_policy()->set_trigger(Next(2) ? "every:1" : Text(6));
        r.mutable_policy()->set_repack(true);
        v1::SetPolicyResponse resp;
        return ops_->SetPolicy(&ctx, r, &resp).error_code();
      }
      case 7: {
        v1::DeleteJobRequest r;
        r.set_job(Next(2) ? "canary" : Name());
        r.set_force(true);
        v1::DeleteJobResponse resp;
        return ops_->DeleteJob(&ctx, r, &resp).error_code();
      }
      case 8: {
        v1::RebalanceRequest r;
        r.set_job("canary");
        v1::RebalanceResponse resp;
        return ops_->Rebalance(&ctx, r, &resp).error_code();
      }
      case 9: {
        v1::ClaimRequest r;
        for (int i = 0, n = static_cast<int>(Next(4)); i < n; ++i) r.add_ids(Text(6));
        r.set_holder(Next(2) ? "canary" : Text(Next(300)));
        r.set_lease_seconds(static_cast<int64_t>(gen_()));
        v1::ClaimResponse resp;
        return sched_->Claim(&ctx, r, &resp).error_code();
      }
      case 10: {
        v1::ReturnRequest r;
        r.add_ids("gpu-1");
        r.add_ids("gpu-1");
        r.set_holder(Text(8));
        v1::ReturnResponse resp;
        return sched_->Return(&ctx, r, &resp).error_code();
      }
      default: {  // raw random bytes as a request body
        static const char* kMethods[] = {
            "/dynmo.v1.AgentService/Register", "/dynmo.v1.AgentService/RegisterHost",
            "/dynmo.v1.OperatorService/GetJob", "/dynmo.v1.SchedulerService/Claim"};
        const std::string body = Bytes(Next(512));
        grpc::Slice slice(body);
        grpc::ByteBuffer request(&slice, 1), response;
        absl::Notification done;
        grpc::Status status;
        generic_.UnaryCall(&ctx, kMethods[Next(4)], grpc::StubOptions(), &request, &response,
                           [&](grpc::Status s) {
                             status = std::move(s);
                             done.Notify();
                           });
        done.WaitForNotification();
        return status.error_code();
      }
    }
  }

 private:
  uint64_t Next(uint64_t n) { return n == 0 ? 0 : gen_() % n; }
  // Raw bytes: only for request bodies (the server's parser meets them).
  std::string Bytes(uint64_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(gen_());
    return s;
  }
  // Printable text for string fields and metadata (a client library may
  // refuse to send invalid UTF-8 or header bytes at all).
  std::string Text(uint64_t n) {
    std::string s(n, ' ');
    for (char& c : s) c = static_cast<char>(33 + gen_() % 94);
    return s;
  }
  std::string Name() { return Next(4) ? absl::StrCat("fz-", Next(200)) : Text(Next(80)); }
  int32_t Int() {
    switch (Next(4)) {
      case 0: return static_cast<int32_t>(gen_());
      case 1: return -1;
      default: return static_cast<int32_t>(Next(6));
    }
  }
  v1::RegisterRequest RandomRegister() {
    v1::RegisterRequest r;
    r.set_job(Next(3) == 0 ? "canary" : Name());
    r.set_rank(Int());
    r.set_pipeline_rank(Int());
    r.set_data_parallel_rank(Int());
    r.set_pipeline_size(Next(2) ? 2 : Int());
    r.set_data_parallel_size(Next(2) ? 1 : Int());
    r.set_num_layers(Next(2) ? 4 : Int());
    r.set_applied_epoch(Next(4) ? 0 : gen_());
    r.set_memory_capacity_bytes(static_cast<int64_t>(gen_()));
    for (int i = 0, n = static_cast<int>(Next(4)); i < n; ++i) r.add_boundaries(Int());
    return r;
  }
  v1::IterationReport RandomReport() {
    v1::IterationReport r;
    r.set_iteration(static_cast<int64_t>(gen_()));
    for (int i = 0, n = static_cast<int>(Next(6)); i < n; ++i) {
      auto* l = r.add_layers();
      l->set_layer(Int());
      double d;
      uint64_t bits = gen_();
      std::memcpy(&d, &bits, sizeof(d));
      l->set_fwd_s(d);
      l->set_bwd_s(Next(2) ? 0.01 : -d);
    }
    return r;
  }

  std::mt19937_64 gen_;
  std::unique_ptr<v1::AgentService::Stub> agents_;
  std::unique_ptr<v1::OperatorService::Stub> ops_;
  std::unique_ptr<v1::SchedulerService::Stub> sched_;
  grpc::GenericStub generic_;
};

// What must not change about the canary job.
nlohmann::json CanaryView(v1::OperatorService::Stub& ops) {
  grpc::ClientContext ctx;
  agent::AddBearerToken(&ctx, kOpsToken);
  v1::GetJobRequest req;
  req.set_job("canary");
  v1::JobStatus st;
  grpc::Status s = ops.GetJob(&ctx, req, &st);
  if (!s.ok()) return {{"error", s.error_message()}};
  const v1::JobSummary& j = st.summary();
  return {{"owner", j.owner()},
          {"epoch", j.epoch()},
          {"applied_epoch", j.applied_epoch()},
          {"connected_ranks", j.connected_ranks()},
          {"trigger", j.policy().trigger()},
          {"repack", j.policy().repack()},
          {"boundaries", std::vector<int>(st.boundaries().begin(), st.boundaries().end())},
          {"history", st.history_size()}};
}

}  // namespace

int main(int argc, char** argv) {
  long requests = 10000;
  int clients = 4;
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--requests=", 0) == 0) {
      requests = std::strtol(a.c_str() + 11, nullptr, 10);
    } else if (a.rfind("--clients=", 0) == 0) {
      clients = std::max(1, std::atoi(a.c_str() + 10));
    } else if (a.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(a.c_str() + 7, nullptr, 10);
    } else {
      std::fprintf(stderr, "dynmo-fuzz-grpc: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  char dir[] = "/tmp/dynmo-fuzz-grpc-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  const std::string principals = std::string(dir) + "/principals";
  std::ofstream(principals) << kCanaryToken << " canary agent\n"
                            << kAttackerToken << " attacker agent,scheduler\n"
                            << kOpsToken << " ops admin\n";
  service::ServerOptions o;
  o.principals_file = principals;
  o.coordinator.state_dir = std::string(dir) + "/state";
  o.coordinator.job.default_policy.trigger = service::ParseTrigger("manual").value();
  auto coord = service::EmbeddedCoordinator::Start(o);
  if (!coord.ok()) {
    std::fprintf(stderr, "dynmo-fuzz-grpc: %s\n", std::string(coord.status().message()).c_str());
    return 1;
  }
  // The canary: two ranks of a 2-stage job, reporting, sessions held.
  std::vector<std::unique_ptr<agent::Agent>> canary;
  for (int r = 0; r < 2; ++r) {
    agent::AgentConfig c;
    c.coordinator = (*coord)->address();
    c.token = kCanaryToken;
    c.job = "canary";
    c.rank = r;
    c.pipeline_rank = r;
    c.pipeline_size = 2;
    c.num_layers = 4;
    auto a = agent::Agent::Start(c);
    if (!a.ok() || !(*a)->WaitConnected(absl::Seconds(10))) {
      std::fprintf(stderr, "dynmo-fuzz-grpc: the canary did not connect\n");
      return 1;
    }
    agent::IterationSample s;
    s.iteration = 0;
    for (int l = 2 * r; l < 2 * r + 2; ++l) s.layers.push_back(core::LayerCost{l, 0.01, 0.02});
    (void)(*a)->ReportIteration(s);
    canary.push_back(*std::move(a));
  }
  auto channel = grpc::CreateChannel((*coord)->address(), grpc::InsecureChannelCredentials());
  auto ops = v1::OperatorService::NewStub(channel);
  // The canary is settled once the coordinator has bound both sessions (an
  // agent counts itself connected when its hello is written, the
  // coordinator when it has read it): a condition, not a clock.
  nlohmann::json before = CanaryView(*ops);
  for (int i = 0; i < 1000 && before.value("connected_ranks", 0) < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    before = CanaryView(*ops);
  }
  if (before.value("connected_ranks", 0) < 2) {
    std::fprintf(stderr, "dynmo-fuzz-grpc: the canary never had both sessions: %s\n",
                 before.dump().c_str());
    return 1;
  }

  absl::Mutex mu;
  std::map<std::string, long> codes;
  std::atomic<long> next{0};
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      // Each client its own connection, as separate processes would have.
      grpc::ChannelArguments args;
      args.SetInt("dynmo.fuzz.client", t);
      Attacker attacker(grpc::CreateCustomChannel((*coord)->address(),
                                                  grpc::InsecureChannelCredentials(), args),
                        seed * 1000 + static_cast<uint64_t>(t));
      std::map<std::string, long> mine;
      while (next.fetch_add(1) < requests) {
        ++mine[absl::StrCat(static_cast<int>(attacker.One()))];
      }
      absl::MutexLock lock(&mu);
      for (const auto& [code, n] : mine) codes[code] += n;
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const nlohmann::json after = CanaryView(*ops);
  const bool unchanged = before == after && !before.contains("error");
  nlohmann::json out = {{"requests", requests},
                        {"clients", clients},
                        {"seconds", seconds},
                        {"status_codes", codes},
                        {"coordinator_answers", !after.contains("error")},
                        {"canary_unchanged", unchanged},
                        {"canary", after}};
  std::printf("%s\n", out.dump().c_str());
  for (auto& a : canary) a->Stop();
  (*coord)->Shutdown();
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  if (!unchanged) {
    std::fprintf(stderr, "dynmo-fuzz-grpc: the canary changed: before %s\n",
                 before.dump().c_str());
    return 1;
  }
  return 0;
}
