// A libFuzzer target over what the coordinator accepts from clients: the
// request validators on raw protobuf bytes, and the job state machine
// (JobRegistry + JobState + plan protocol) driven by a script decoded from
// the input — registrations of any shape, sessions with right and wrong
// keys, reports with any numbers (NaN, Inf, huge, negative), acks of any
// epoch and state, host batches, ticks, rebalances, policies, deletions.
// After every step it checks what must always hold: no crash, epochs never
// go backwards, a job's applied epoch never passes its issued one, and the
// durable record restores into a job that reports the same epochs.
//
// Built twice: with clang's -fsanitize=fuzzer by scripts/fuzz.sh (coverage
// guided), and in the ordinary build linked with random_driver_main.cc for
// a bounded, seeded run under ctest (fuzz.JobState).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/service/event_log.h"
#include "coordinator/service/job_registry.h"
#include "coordinator/service/metrics.h"
#include "coordinator/job/policy.h"
#include "coordinator/service/released_pool.h"
#include "coordinator/service/state_store.h"
#include "coordinator/job/validation.h"
#include "google/protobuf/stubs/logging.h"
#include "wire/report_codec.h"

namespace {

using namespace dynmo;

// Reads the script; past the end every value is 0.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool done() const { return n_ == 0; }
  uint8_t u8() { return n_ > 0 ? (--n_, *p_++) : 0; }
  template <typename T>
  T raw() {
    T v{};
    const size_t k = std::min(sizeof(T), n_);
    std::memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  // A small value most of the time, anything sometimes.
  int64_t i64() { return u8() < 200 ? static_cast<int64_t>(u8()) - 8 : raw<int64_t>(); }
  double f64() {
    switch (u8() % 6) {
      case 0: return std::numeric_limits<double>::quiet_NaN();
      case 1: return std::numeric_limits<double>::infinity();
      case 2: return raw<double>();
      case 3: return -1e-3;
      default: return 1e-4 * (1 + u8());
    }
  }
  std::string bytes() {
    const size_t k = std::min<size_t>(u8(), n_);
    std::string s(reinterpret_cast<const char*>(p_), k);
    p_ += k;
    n_ -= k;
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

// Keeps what a session receives: the newest PREPARE's epoch drives acks.
class Sink : public service::SessionSink {
 public:
  void SendTo(absl::Span<const int> /*ranks*/, std::shared_ptr<const dynmo::v1::CoordinatorMessage> m) override {
    absl::MutexLock lock(&mu_);
    if (m->has_prepare()) prepared_ = m->prepare().epoch();
  }
  void Close(const absl::Status&) override {}
  uint64_t prepared() {
    absl::MutexLock lock(&mu_);
    return prepared_;
  }

 private:
  absl::Mutex mu_;
  uint64_t prepared_ = 0;
};

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "job state fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

constexpr int kMaxRank = 8;

dynmo::v1::RegisterRequest Register(Reader& in, int pp, int dp, int layers) {
  dynmo::v1::RegisterRequest r;
  r.set_job(in.u8() < 230 ? "job" : in.bytes());
  const int rank = static_cast<int>(in.u8() % (kMaxRank + 2)) - 1;
  r.set_rank(rank);
  r.set_pipeline_rank(pp > 0 ? rank % pp : rank);
  r.set_data_parallel_rank(pp > 0 ? rank / pp : 0);
  r.set_pipeline_size(in.u8() < 240 ? pp : static_cast<int32_t>(in.raw<uint16_t>()));
  r.set_data_parallel_size(dp);
  r.set_num_layers(in.u8() < 240 ? layers : static_cast<int32_t>(in.raw<int32_t>()));
  r.set_memory_capacity_bytes(in.u8() < 200 ? (int64_t{1} << 34) : in.raw<int64_t>());
  r.set_applied_epoch(in.u8() < 220 ? 0 : static_cast<uint64_t>(in.i64()));
  r.set_pending_epoch(in.u8() < 220 ? 0 : static_cast<uint64_t>(in.i64()));
  r.set_microbatches(in.u8() % 10);
  return r;
}

dynmo::v1::IterationReport Report(Reader& in, int layers) {
  dynmo::v1::IterationReport rep;
  rep.set_iteration(in.i64());
  rep.set_applied_epoch(static_cast<uint64_t>(in.u8() < 200 ? in.u8() % 4 : in.i64()));
  rep.set_model_changed(in.u8() < 20);
  const int n = in.u8() % 6;
  for (int i = 0; i < n; ++i) {
    auto* l = rep.add_layers();
    l->set_layer(in.u8() < 230 ? static_cast<int>(in.u8()) % std::max(layers, 1)
                               : static_cast<int>(in.raw<int32_t>()));
    l->set_fwd_s(in.f64());
    l->set_bwd_s(in.f64());
    l->set_wgrad_s(in.f64());
    l->set_resident_bytes(in.u8() < 230 ? 1 << 20 : in.raw<int64_t>());
  }
  return rep;
}

dynmo::v1::PlanAck Ack(Reader& in, uint64_t prepared) {
  dynmo::v1::PlanAck a;
  a.set_epoch(in.u8() < 200 ? prepared : static_cast<uint64_t>(in.i64()));
  a.set_state(static_cast<dynmo::v1::PlanAck::State>(in.u8() % 5));
  a.set_iteration(in.i64());
  return a;
}

template <typename Message>
void ParseAndValidate(Reader& in, absl::Status (*validate)(const Message&)) {
  Message m;
  const std::string b = in.bytes();
  if (m.ParseFromString(b)) (void)validate(m);
}

void Run(Reader& in) {
  service::StateKeeper keeper("");
  (void)keeper.Open();
  service::ReleasedPool pool(&keeper);
  service::CoordinatorMetrics metrics;
  service::JobOptions options;
  options.default_policy.trigger.kind = service::Trigger::Kind::kManual;
  options.plan_lead_iterations = 3;
  options.in_band_commit = in.u8() < 40;
  service::JobRegistry registry(options, service::JobDeps{&keeper, &pool, &metrics},
                                 service::JobLimits{/*max_jobs=*/4, /*max_jobs_per_owner=*/2});
  const int pp = 1 + in.u8() % 4;
  const int dp = 1 + in.u8() % 2;
  const int layers = pp + in.u8() % 8;
  std::map<int, std::string> keys;
  std::map<int, std::shared_ptr<Sink>> sinks;
  uint64_t last_epoch = 0;
  absl::Time now = absl::FromUnixSeconds(1'700'000'000);

  for (int step = 0; step < 400 && !in.done(); ++step) {
    auto job = registry.Find("job");
    const int rank = static_cast<int>(in.u8() % (kMaxRank + 1)) - (in.u8() < 10 ? 1 : 0);
    switch (in.u8() % 13) {
      case 0: {
        dynmo::v1::RegisterResponse resp;
        const dynmo::v1::RegisterRequest r = Register(in, pp, dp, layers);
        if (registry.Register(r, &resp, in.u8() < 30 ? "other" : "").ok()) {
          keys[r.rank()] = resp.session_key();
        }
        break;
      }
      case 1:
        if (job.ok()) {
          auto sink = std::make_shared<Sink>();
          const std::string key = in.u8() < 220 && keys.count(rank) ? keys[rank] : in.bytes();
          if ((*job)->Attach(rank, key, sink).ok()) sinks[rank] = sink;
        }
        break;
      case 2:
      case 3:
        if (job.ok()) (void)(*job)->OnReport(rank, Report(in, layers));
        break;
      case 4:
        if (job.ok()) {
          const uint64_t prepared = sinks.count(rank) ? sinks[rank]->prepared() : 0;
          (void)(*job)->OnAck(rank, Ack(in, prepared));
        }
        break;
      case 5:
        if (job.ok()) {
          dynmo::v1::HostBatch batch;
          const int n = in.u8() % 5;
          for (int i = 0; i < n; ++i) {
            auto* m = batch.add_messages();
            const int r = static_cast<int>(in.u8() % (kMaxRank + 1));
            m->set_rank(r);
            if (in.u8() % 2 == 0) {
              *m->mutable_report() = Report(in, layers);
            } else if (in.u8() < 250) {
              *m->mutable_ack() = Ack(in, sinks.count(r) ? sinks[r]->prepared() : 0);
            }
          }
          (void)(*job)->OnHostBatch(batch);
        }
        break;
      case 6:
        now += absl::Milliseconds(in.u8()) * (in.u8() < 10 ? 1000 : 1);
        if (job.ok()) (*job)->Tick(now);
        break;
      case 7:
        if (job.ok()) (void)(*job)->Rebalance(now);
        break;
      case 8:
        if (job.ok()) {
          static const char* kTriggers[] = {"manual", "auto", "every:1", "every:0",
                                            "on-event", "every:-3", "x"};
          static const char* kBalancers[] = {"", "time", "optimal", "diffusion", "nope"};
          dynmo::v1::Policy p;
          p.set_trigger(kTriggers[in.u8() % 7]);
          p.set_balancer(kBalancers[in.u8() % 5]);
          p.set_repack(in.u8() % 2 == 0);
          p.set_repack_tolerance(in.f64());
          (void)(*job)->SetPolicy(p);
        }
        break;
      case 9:
        if (registry.Delete("job", in.u8() % 2 == 0).ok()) {
          keys.clear();
          sinks.clear();
          last_epoch = 0;
        }
        break;
      case 10:
        if (job.ok() && sinks.count(rank)) (*job)->Detach(rank, sinks[rank].get());
        break;
      case 11:
        switch (in.u8() % 5) {
          case 0: ParseAndValidate<dynmo::v1::RegisterRequest>(in, service::ValidateRegister); break;
          case 1: ParseAndValidate<dynmo::v1::PlanAck>(in, service::ValidateAck); break;
          case 2:
            ParseAndValidate<dynmo::v1::RegisterHostRequest>(in, service::ValidateRegisterHost);
            break;
          case 3: ParseAndValidate<dynmo::v1::HostHello>(in, service::ValidateHostHello); break;
          default: {
            dynmo::v1::IterationReport r;
            if (r.ParseFromString(in.bytes())) (void)wire::ReadReport(r, layers);
          }
        }
        break;
      default:
        if (job.ok()) {
          google::protobuf::RepeatedPtrField<dynmo::v1::RegisterRequest> many;
          const int n = 1 + in.u8() % 3;
          for (int i = 0; i < n; ++i) *many.Add() = Register(in, pp, dp, layers);
          std::vector<dynmo::v1::RegisterResponse> responses;
          if ((*job)->RegisterMany(many, &responses).ok()) {
            for (int i = 0; i < n; ++i) keys[many[i].rank()] = responses[i].session_key();
          }
        }
    }
    // What must always hold.
    auto after = registry.Find("job");
    if (!after.ok()) continue;
    const dynmo::v1::JobSummary s = (*after)->Summary();
    Check(s.applied_epoch() <= s.epoch(), "applied epoch beyond the issued one");
    Check(s.epoch() >= last_epoch, "the epoch went backwards");
    last_epoch = s.epoch();
    (void)(*after)->Status();
    if (step % 16 == 0) {
      service::StateKeeper scratch("");
      service::ReleasedPool scratch_pool(&scratch);
      service::JobState restored((*after)->Record(), options,
                                 service::JobDeps{&scratch, &scratch_pool, nullptr});
      Check(restored.Summary().epoch() == s.epoch(), "the record restores another epoch");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Random bytes in string fields make protobuf log every parse, and every
  // job the input creates is an event line; the validators' and the state
  // machine's answers are what is tested, not those lines.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    static std::ostream discard(nullptr);  // no buffer: writes go nowhere
    dynmo::service::ConfigureEventLog(dynmo::service::EventLogOptions{
        dynmo::service::LogFormat::kLogfmt, dynmo::service::LogLevel::kError, &discard});
    return true;
  }();
  (void)quiet;
  Reader in(data, size);
  Run(in);
  return 0;
}
