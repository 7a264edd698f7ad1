// dynmo-bench-stream-attack: clients that cost a coordinator memory without
// ever doing their part (issue 43 item 2), for bench/coordinator_attack.sh.
//
//   --mode=pool --state_dir=DIR --gpus=2000
//       writes DIR/pool.pb: a released pool of that many free GPUs, so a
//       daemon started on DIR has a pool to claim and return.
//   --mode=watchers --coordinator=ADDR --count=64 --seconds=5
//       opens `count` WatchReleased streams that never read (their HTTP/2
//       window is never granted again), then, as a scheduler, claims and
//       returns the whole pool over and over for `seconds`; finally reads
//       each stream out and prints how they ended.
//   --mode=helloless --coordinator=ADDR --count=10000 --seconds=5
//       opens `count` Session streams that never send a message, holds them
//       `seconds`, cancels them, and prints how they ended.
// One JSON line on stdout: the streams by final status code, and counts.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/service/record_file.h"
#include "dynmo/v1/agent.grpc.pb.h"
#include "dynmo/v1/scheduler.grpc.pb.h"
#include "dynmo/v1/state.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, mode, "", "pool | watchers | helloless");
ABSL_FLAG(std::string, coordinator, "", "HOST:PORT of a running dynmo-coordinator");
ABSL_FLAG(std::string, state_dir, "", "pool: the state dir to write pool.pb into");
ABSL_FLAG(int, gpus, 2000, "pool: free GPUs in the pool");
ABSL_FLAG(int, count, 64, "streams to open");
ABSL_FLAG(double, seconds, 5, "how long the attack lasts");

namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "dynmo-bench-stream-attack: %s\n", why.c_str());
  return 2;
}

int WritePool() {
  dynmo::v1::CoordinatorState pool;
  const int gpus = absl::GetFlag(FLAGS_gpus);
  for (int i = 1; i <= gpus; ++i) {
    dynmo::v1::ReleasedGpu* g = pool.add_pool();
    g->set_id(absl::StrCat("gpu-", i));
    g->set_job("gone");
    g->set_host(absl::StrCat("node", i / 8));
    g->set_device(i % 8);
    g->set_rank(i);
    g->set_stage(i);
    g->set_memory_capacity_bytes(int64_t{80} << 30);
    g->set_epoch(1);
    g->set_reason("repack");
    g->set_state(dynmo::v1::ReleasedGpu::FREE);
  }
  pool.set_next_gpu_id(static_cast<uint64_t>(gpus) + 1);
  const std::string path = absl::GetFlag(FLAGS_state_dir) + "/pool.pb";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << dynmo::service::FramedRecord(pool.SerializeAsString());
  std::printf("{\"pool\": \"%s\", \"gpus\": %d}\n", path.c_str(), gpus);
  return 0;
}

std::map<std::string, int> Codes(const std::vector<grpc::Status>& statuses) {
  std::map<std::string, int> codes;
  for (const grpc::Status& s : statuses) ++codes[std::to_string(s.error_code())];
  return codes;
}

int Watchers(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = dynmo::v1::SchedulerService::NewStub(channel);
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<dynmo::v1::ReleasedEvent>> reader;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < absl::GetFlag(FLAGS_count); ++i) {
    auto w = std::make_unique<Watch>();
    w->reader = stub->WatchReleased(&w->context, dynmo::v1::WatchReleasedRequest());
    watches.push_back(std::move(w));
  }
  // The scheduler: claim and return the whole pool, 100 ids a call.
  std::vector<std::string> ids;
  {
    grpc::ClientContext ctx;
    dynmo::v1::ListReleasedResponse list;
    if (grpc::Status s = stub->ListReleased(&ctx, {}, &list); !s.ok()) {
      return Fail("ListReleased: " + s.error_message());
    }
    for (const auto& g : list.gpus()) ids.push_back(g.id());
  }
  int64_t calls = 0;
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds));
  while (std::chrono::steady_clock::now() < end) {
    for (bool claim : {true, false}) {
      for (size_t at = 0; at < ids.size(); at += 100) {
        grpc::ClientContext ctx;
        grpc::Status s;
        if (claim) {
          dynmo::v1::ClaimRequest req;
          for (size_t k = at; k < ids.size() && k < at + 100; ++k) req.add_ids(ids[k]);
          req.set_holder("attack");
          req.set_lease_seconds(600);
          dynmo::v1::ClaimResponse resp;
          s = stub->Claim(&ctx, req, &resp);
        } else {
          dynmo::v1::ReturnRequest req;
          for (size_t k = at; k < ids.size() && k < at + 100; ++k) req.add_ids(ids[k]);
          req.set_holder("attack");
          dynmo::v1::ReturnResponse resp;
          s = stub->Return(&ctx, req, &resp);
        }
        ++calls;
        if (!s.ok()) return Fail("claim/return: " + s.error_message());
      }
    }
  }
  // Now read each stream out: an ended one says how.
  std::vector<grpc::Status> ended;
  for (auto& w : watches) w->context.TryCancel();
  int64_t events = 0;
  for (auto& w : watches) {
    dynmo::v1::ReleasedEvent e;
    while (w->reader->Read(&e)) ++events;
    ended.push_back(w->reader->Finish());
  }
  nlohmann::json out = {{"mode", "watchers"},   {"streams", watches.size()},
                        {"pool_gpus", ids.size()}, {"claim_return_calls", calls},
                        {"events_read_after", events}, {"status_codes", Codes(ended)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// A Session that never says anything: started, then left alone.
class Silent final : public grpc::ClientBidiReactor<dynmo::v1::AgentMessage,
                                                     dynmo::v1::CoordinatorMessage> {
 public:
  Silent(dynmo::v1::AgentService::Stub* stub, std::atomic<int>* done) : done_(done) {
    stub->async()->Session(&context_, this);
    StartRead(&in_);
    StartCall();
  }
  void OnReadDone(bool) override {}
  void OnDone(const grpc::Status& s) override {
    absl::MutexLock lock(&mu_);
    status_ = s;
    ++*done_;
  }
  void Cancel() { context_.TryCancel(); }
  grpc::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  grpc::ClientContext context_;
  dynmo::v1::CoordinatorMessage in_;
  std::atomic<int>* done_;
  absl::Mutex mu_;
  grpc::Status status_;
};

int Helloless(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = dynmo::v1::AgentService::NewStub(channel);
  std::atomic<int> done{0};
  std::vector<std::unique_ptr<Silent>> sessions;
  for (int i = 0; i < absl::GetFlag(FLAGS_count); ++i) {
    sessions.push_back(std::make_unique<Silent>(stub.get(), &done));
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  const int ended_by_server = done.load();
  for (auto& s : sessions) s->Cancel();
  while (done.load() < static_cast<int>(sessions.size())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<grpc::Status> statuses;
  for (auto& s : sessions) statuses.push_back(s->status());
  nlohmann::json out = {{"mode", "helloless"},
                        {"streams", sessions.size()},
                        {"ended_by_the_server_while_held", ended_by_server},
                        {"status_codes", Codes(statuses)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) return Fail(absl::StrCat("unexpected argument '", rest[1], "'"));
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "pool") {
    if (absl::GetFlag(FLAGS_state_dir).empty()) return Fail("--mode=pool needs --state_dir");
    return WritePool();
  }
  if (mode != "watchers" && mode != "helloless") {
    return Fail("--mode must be pool, watchers or helloless");
  }
  if (absl::GetFlag(FLAGS_coordinator).empty()) return Fail("--coordinator is required");
  if (absl::GetFlag(FLAGS_count) < 1) return Fail("--count must be >= 1");
  auto channel = grpc::CreateChannel(absl::GetFlag(FLAGS_coordinator),
                                     grpc::InsecureChannelCredentials());
  return mode == "watchers" ? Watchers(channel) : Helloless(channel);
}
