#include "coordinator/job/rank_roster.h"

#include <sys/random.h>

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job/constant_time.h"
#include "absl/strings/str_join.h"

namespace dynmo::service {
namespace {

// 128 random bits from the kernel's CSPRNG, as 32 hex digits.
std::string NewSessionKey() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key(2 * sizeof(bytes), '0');
  for (size_t i = 0; i < sizeof(bytes); ++i) {
    key[2 * i] = kHex[bytes[i] >> 4];
    key[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return key;
}


// From a RegisterRequest or a restored RankRecord: they name the same fields.
template <typename Message>
void SetRegistered(const Message& m, RosterRank* r) {
  r->registered = true;
  r->pipeline_rank = m.pipeline_rank();
  r->data_parallel_rank = m.data_parallel_rank();
  r->host = m.host();
  r->device = m.device();
  r->memory_capacity_bytes = m.memory_capacity_bytes();
}

}  // namespace

RankRoster::RankRoster(JobShape shape)
    : shape_(std::move(shape)),
      ranks_(static_cast<size_t>(
          std::max(shape_.pipeline_size * shape_.data_parallel_size, 0))) {}

absl::Status RankRoster::CheckRegister(
    const dynmo::v1::RegisterRequest& request) const {
  const JobShape& s = shape_;
  if (request.pipeline_size() != s.pipeline_size ||
      request.data_parallel_size() != s.data_parallel_size ||
      request.num_layers() != s.num_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", s.job, " is ", s.pipeline_size, " stages x ",
        s.data_parallel_size, " replicas x ", s.num_layers, " layers; rank ",
        request.rank(), " registered ", request.pipeline_size(), " x ",
        request.data_parallel_size(), " x ", request.num_layers()));
  }
  if (!s.fingerprint.empty() && !request.model_fingerprint().empty() &&
      request.model_fingerprint() != s.fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", s.job, " runs model '", s.fingerprint, "', rank ",
        request.rank(), " registered '", request.model_fingerprint(), "'"));
  }
  if (!Contains(request.rank())) {
    return absl::NotFoundError(
        absl::StrCat("job ", s.job, " has no rank ", request.rank()));
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const RosterRank& o = ranks_[i];
    if (static_cast<int>(i) != request.rank() && o.registered &&
        o.pipeline_rank == request.pipeline_rank() &&
        o.data_parallel_rank == request.data_parallel_rank()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", request.pipeline_rank(), " replica ",
          request.data_parallel_rank(), " is already rank ", i));
    }
  }
  const RosterRank& r = at(request.rank());
  if (r.registered && (r.pipeline_rank != request.pipeline_rank() ||
                       r.data_parallel_rank != request.data_parallel_rank())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", request.rank(), " was stage ", r.pipeline_rank, " replica ",
        r.data_parallel_rank, ", not stage ", request.pipeline_rank(),
        " replica ", request.data_parallel_rank()));
  }
  return absl::OkStatus();
}

void RankRoster::Register(const dynmo::v1::RegisterRequest& request) {
  SetRegistered(request, &at(request.rank()));
  at(request.rank()).session_key = NewSessionKey();
  if (shape_.fingerprint.empty()) shape_.fingerprint = request.model_fingerprint();
  shape_.planned_iterations = std::max(shape_.planned_iterations, request.planned_iterations());
}

void RankRoster::Restore(const dynmo::v1::JobRecord& record) {
  for (const auto& rr : record.ranks()) {
    if (Contains(rr.rank())) SetRegistered(rr, &at(rr.rank()));
  }
}

void RankRoster::Reshape(int pipeline_size, int data_parallel_size) {
  shape_.pipeline_size = pipeline_size;
  shape_.data_parallel_size = data_parallel_size;
  for (int r = 0; r < size(); ++r) {
    RosterRank& rank = ranks_[static_cast<size_t>(r)];
    if (!rank.registered) continue;
    rank.pipeline_rank = r / data_parallel_size;
    rank.data_parallel_rank = r % data_parallel_size;
    rank.memory_used_bytes = 0;  // the stage it measured is gone
  }
}

void RankRoster::ToRecord(dynmo::v1::JobRecord* record) const {
  record->set_name(shape_.job);
  record->set_pipeline_size(shape_.pipeline_size);
  record->set_data_parallel_size(shape_.data_parallel_size);
  record->set_num_layers(shape_.num_layers);
  record->set_model_fingerprint(shape_.fingerprint);
  record->set_planned_iterations(shape_.planned_iterations);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const RosterRank& r = ranks_[i];
    if (!r.registered) continue;
    auto* rr = record->add_ranks();
    rr->set_rank(static_cast<int>(i));
    rr->set_pipeline_rank(r.pipeline_rank);
    rr->set_data_parallel_rank(r.data_parallel_rank);
    rr->set_host(r.host);
    rr->set_device(r.device);
    rr->set_memory_capacity_bytes(r.memory_capacity_bytes);
  }
}

absl::Status RankRoster::CheckAttach(int rank, absl::string_view session_key) const {
  if (!Contains(rank)) {
    return absl::NotFoundError(
        absl::StrCat("job ", shape_.job, " has no rank ", rank));
  }
  if (!at(rank).registered) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " of job ", shape_.job,
                     " must call Register before opening a session"));
  }
  return CheckKey(rank, session_key);
}

absl::Status RankRoster::CheckKey(int rank, absl::string_view key) const {
  const std::string& want = at(rank).session_key;
  const bool equal = ConstantTimeEquals(key, want);
  if (want.empty() || !equal) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the session key of rank ", rank, " of job ", shape_.job,
        " is not the one its newest Register issued (register again)"));
  }
  return absl::OkStatus();
}

absl::Status RankRoster::CheckAttachHost(absl::Span<const int> ranks,
                                         absl::Span<const std::string> session_keys,
                                         const SessionSink& sink) const {
  if (session_keys.size() != ranks.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a host hello needs one session key per rank: ", ranks.size(), " ranks, ",
        session_keys.size(), " keys"));
  }
  for (size_t k = 0; k < ranks.size(); ++k) {
    const int rank = ranks[k];
    if (!Contains(rank)) {
      return absl::NotFoundError(absl::StrCat("job ", shape_.job,
                                              " has no rank ", rank,
                                              " (it has ", ranks_.size(), ")"));
    }
    const RosterRank& r = at(rank);
    if (!r.registered) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " of job ", shape_.job,
          " must be registered (RegisterHost) before its host session"));
    }
    if (absl::Status s = CheckKey(rank, session_keys[k]); !s.ok()) return s;
    if (r.sink != nullptr && r.sink.get() != &sink && !r.sink->host().empty() &&
        r.sink->host() != sink.host()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "rank ", rank, " of job ", shape_.job,
          " is carried by a live host session of host '", r.sink->host(),
          "', not '", sink.host(), "'"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<SessionSink>> RankRoster::Attach(
    absl::Span<const int> ranks, const std::shared_ptr<SessionSink>& sink) {
  std::vector<std::shared_ptr<SessionSink>> replaced;
  for (int rank : ranks) {
    RosterRank& r = at(rank);
    // A multiplexed session may be replaced for several ranks at once.
    if (r.sink != nullptr && r.sink != sink &&
        std::find(replaced.begin(), replaced.end(), r.sink) == replaced.end()) {
      replaced.push_back(r.sink);
    }
    r.sink = sink;
  }
  return replaced;
}

void RankRoster::Detach(absl::Span<const int> ranks, const SessionSink* sink) {
  for (int rank : ranks) {
    if (Contains(rank) && at(rank).sink.get() == sink) at(rank).sink = nullptr;
  }
}

int RankRoster::connected() const {
  int n = 0;
  for (const RosterRank& r : ranks_) n += r.sink != nullptr ? 1 : 0;
  return n;
}

void RankRoster::RecordReport(int rank,
                              const dynmo::v1::IterationReport& report,
                              bool active, bool model_changed) {
  RosterRank& r = at(rank);
  if (active) r.memory_used_bytes = report.stage_memory_used_bytes();
  if (report.stage_memory_capacity_bytes() > 0) {
    r.memory_capacity_bytes = report.stage_memory_capacity_bytes();
  }
  const int64_t iteration = report.iteration();
  r.last_iteration = iteration;
  newest_iteration_ = restored_ ? iteration : std::max(newest_iteration_, iteration);
  restored_ = false;
  if (model_changed) {
    model_changed_iteration_ = std::max(model_changed_iteration_, iteration);
    ++model_changes_;
  }
}

void RankRoster::RestoreProgress(int64_t last_iteration) {
  newest_iteration_ = last_iteration;
  restored_ = true;
}

void RankRoster::OnResumed() {
  restored_ = true;
  model_changed_iteration_ = -1;
}

void RankRoster::RecordAck(int rank, int64_t iteration) {
  RosterRank& r = at(rank);
  if (iteration > r.last_iteration) r.last_iteration = iteration;
}

bool RankRoster::IsActiveStage(absl::Span<const int> active, int stage) {
  return std::binary_search(active.begin(), active.end(), stage);
}

bool RankRoster::Participates(int rank, absl::Span<const int> active) const {
  const RosterRank& r = at(rank);
  return !r.registered || IsActiveStage(active, r.pipeline_rank);
}

int RankRoster::CountParticipants(absl::Span<const int> active) const {
  int n = 0;
  for (int i = 0; i < size(); ++i) n += Participates(i, active) ? 1 : 0;
  return n;
}

std::vector<int> RankRoster::MissingParticipants(absl::Span<const int> active,
                                                 bool need_session) const {
  // Active ranks = data_parallel_size * active stages; each must be
  // registered (and connected when asked).
  std::vector<int> missing;
  int present = 0;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const RosterRank& r = ranks_[i];
    if (!r.registered || !IsActiveStage(active, r.pipeline_rank)) continue;
    if (need_session && r.sink == nullptr) {
      missing.push_back(static_cast<int>(i));
      continue;
    }
    ++present;
  }
  const int want = shape_.data_parallel_size * static_cast<int>(active.size());
  if (present + static_cast<int>(missing.size()) < want) {
    missing.push_back(-1);  // some ranks never registered
  }
  return missing;
}

absl::Status RankRoster::CheckConnected(absl::Span<const int> active) const {
  const std::vector<int> missing = MissingParticipants(active, true);
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", shape_.job, " has active ranks without a session (",
      absl::StrJoin(missing, ","), "; -1 = never registered)"));
}

bool RankRoster::ReportedSince(absl::Span<const int> active,
                               int64_t iteration) const {
  for (const RosterRank& r : ranks_) {
    if (r.registered && IsActiveStage(active, r.pipeline_rank) &&
        r.last_iteration < iteration) {
      return false;
    }
  }
  return true;
}

std::vector<SessionRanks> RankRoster::DetachAll() {
  std::vector<SessionRanks> out;
  absl::flat_hash_map<const SessionSink*, size_t> index;
  for (int i = 0; i < size(); ++i) {
    RosterRank& r = at(i);
    if (r.sink == nullptr) continue;
    auto [it, fresh] = index.try_emplace(r.sink.get(), out.size());
    if (fresh) out.push_back(SessionRanks{r.sink, {}});
    out[it->second].ranks.push_back(i);
    r.sink = nullptr;
  }
  return out;
}

std::vector<SessionRanks> RankRoster::ParticipantSessions(
    absl::Span<const int> active) const {
  // One entry per sink: a multiplexed session gets a message once with the
  // list of its participating ranks.
  std::vector<SessionRanks> out;
  absl::flat_hash_map<const SessionSink*, size_t> index;
  for (int i = 0; i < size(); ++i) {
    const RosterRank& r = at(i);
    if (r.sink == nullptr || !Participates(i, active)) continue;
    auto [it, fresh] = index.try_emplace(r.sink.get(), out.size());
    if (fresh) out.push_back(SessionRanks{r.sink, {}});
    out[it->second].ranks.push_back(i);
  }
  return out;
}

std::vector<std::vector<int>> RankRoster::RegisteredByStage() const {
  std::vector<std::vector<int>> by_stage(static_cast<size_t>(shape_.pipeline_size));
  for (int i = 0; i < size(); ++i) {
    const RosterRank& r = at(i);
    if (r.registered && r.pipeline_rank >= 0 && r.pipeline_rank < shape_.pipeline_size) {
      by_stage[static_cast<size_t>(r.pipeline_rank)].push_back(i);
    }
  }
  return by_stage;
}

std::vector<core::StageMemoryReport> RankRoster::StageMemory(
    absl::Span<const int> active) const {
  // One pass over the ranks, not one per stage: a job of 65,536 stages
  // would otherwise cost 2^32 steps per status.
  const std::vector<std::vector<int>> by_stage = RegisteredByStage();
  std::vector<core::StageMemoryReport> stages(active.size());
  for (size_t s = 0; s < active.size(); ++s) {
    if (active[s] < 0 || active[s] >= shape_.pipeline_size) continue;
    core::StageMemoryReport& st = stages[s];
    for (int i : by_stage[static_cast<size_t>(active[s])]) {
      const RosterRank& r = at(i);
      st.used_bytes = std::max(st.used_bytes, r.memory_used_bytes);
      if (r.memory_capacity_bytes > 0) {
        st.capacity_bytes = st.capacity_bytes < 0
                                ? r.memory_capacity_bytes
                                : std::min(st.capacity_bytes, r.memory_capacity_bytes);
      }
    }
  }
  return stages;
}

std::vector<dynmo::v1::ReleasedGpu> RankRoster::ReleasedBy(
    const dynmo::v1::Plan& plan, absl::Time now) const {
  const std::vector<std::vector<int>> by_stage = RegisteredByStage();
  std::vector<dynmo::v1::ReleasedGpu> released;
  for (int stage : plan.released_stages()) {
    if (stage < 0 || stage >= shape_.pipeline_size) continue;
    for (int i : by_stage[static_cast<size_t>(stage)]) {
      const RosterRank& r = at(i);
      dynmo::v1::ReleasedGpu g;
      g.set_job(shape_.job);
      g.set_host(r.host);
      g.set_device(r.device);
      g.set_rank(i);
      g.set_stage(stage);
      g.set_memory_capacity_bytes(r.memory_capacity_bytes);
      g.set_epoch(plan.epoch());
      g.set_released_unix_ms(absl::ToUnixMillis(now));
      g.set_reason(absl::StrCat("re-packed by plan epoch ", plan.epoch(), " (",
                                plan.reason(), ")"));
      released.push_back(std::move(g));
    }
  }
  return released;
}

}  // namespace dynmo::service
