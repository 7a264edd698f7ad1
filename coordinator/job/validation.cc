#include "coordinator/job/validation.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/boundaries.h"
#include "core/cost_model.h"
#include "core/pipeline_sim.h"

namespace dynmo::service {
namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

using core::FiniteNonNegative;

// No ASCII control character (C0 or DEL): a host name ends up in log lines
// and terminals. UTF-8 above ASCII is let through.
bool PrintableText(absl::string_view text) {
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return false;
  }
  return true;
}

bool Bytes(int64_t v) { return v >= 0 && v <= kMaxBytes; }

}  // namespace

absl::Status ValidateJobName(absl::string_view name) {
  if (name.empty()) return Invalid("job name is empty");
  if (name.size() > kMaxJobNameChars) {
    return Invalid(absl::StrCat("job name longer than ", kMaxJobNameChars,
                                " characters"));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Invalid(absl::StrCat("job name '", name,
                                  "' may only use [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRegister(const dynmo::v1::RegisterRequest& r) {
  if (absl::Status s = ValidateJobName(r.job()); !s.ok()) return s;
  if (r.pipeline_size() < 1 || r.data_parallel_size() < 1) {
    return Invalid("pipeline_size and data_parallel_size must be >= 1");
  }
  const int64_t world =
      static_cast<int64_t>(r.pipeline_size()) * r.data_parallel_size();
  if (world > kMaxRanksPerJob) {
    return Invalid(absl::StrCat("job of ", world, " ranks exceeds the limit of ",
                                kMaxRanksPerJob));
  }
  if (r.rank() < 0 || r.rank() >= world) {
    return Invalid(absl::StrCat("rank ", r.rank(), " outside [0, ", world, ")"));
  }
  if (r.pipeline_rank() < 0 || r.pipeline_rank() >= r.pipeline_size()) {
    return Invalid(absl::StrCat("pipeline_rank ", r.pipeline_rank(),
                                " outside [0, ", r.pipeline_size(), ")"));
  }
  if (r.data_parallel_rank() < 0 ||
      r.data_parallel_rank() >= r.data_parallel_size()) {
    return Invalid(absl::StrCat("data_parallel_rank ", r.data_parallel_rank(),
                                " outside [0, ", r.data_parallel_size(), ")"));
  }
  if (r.num_layers() < r.pipeline_size() || r.num_layers() > kMaxLayers) {
    return Invalid(absl::StrCat("num_layers ", r.num_layers(),
                                " must be in [pipeline_size, ", kMaxLayers,
                                "]"));
  }
  if (static_cast<int64_t>(r.data_parallel_size()) * r.num_layers() > kMaxReplicaLayers) {
    return Invalid(absl::StrCat("data_parallel_size x num_layers = ",
                                static_cast<int64_t>(r.data_parallel_size()) * r.num_layers(),
                                " exceeds the limit of ", kMaxReplicaLayers));
  }
  if (!Bytes(r.memory_capacity_bytes())) {
    return Invalid(absl::StrCat("memory_capacity_bytes must be in [0, ", kMaxBytes, "]"));
  }
  if (r.applied_epoch() > kMaxEpoch || r.pending_epoch() > kMaxEpoch) {
    return Invalid(absl::StrCat("applied_epoch and pending_epoch must be <= ", kMaxEpoch));
  }
  if (r.host().size() > 256 || r.model_fingerprint().size() > 256) {
    return Invalid("host and model_fingerprint are limited to 256 bytes");
  }
  if (!PrintableText(r.host())) {
    return Invalid("host holds a control character (printable text only)");
  }
  if (r.device() < 0) {
    return Invalid(absl::StrCat("device ", r.device(), " is negative"));
  }
  if (r.microbatches() < 0 || r.microbatches() > 1 << 20) {
    return Invalid("microbatches must be in [0, 2^20]");
  }
  if (r.planned_iterations() < 0) {
    return Invalid(absl::StrCat("planned_iterations ", r.planned_iterations(),
                                " is negative (0 = unknown)"));
  }
  if (!r.schedule().empty()) {
    if (absl::Status s = core::ParseSchedule(r.schedule()).status(); !s.ok()) {
      return Invalid(absl::StrCat("schedule: ", s.message()));
    }
  }
  int active = r.pipeline_size();
  if (r.active_stages_size() > 0) {
    active = r.active_stages_size();
    int prev = -1;
    for (int s : r.active_stages()) {
      if (s <= prev || s >= r.pipeline_size()) {
        return Invalid(
            "active_stages must be strictly increasing stage ids below "
            "pipeline_size");
      }
      prev = s;
    }
  }
  if (r.boundaries_size() > 0) {
    std::vector<int> b(r.boundaries().begin(), r.boundaries().end());
    if (absl::Status s = core::ValidateBoundaries(b, r.num_layers(), active);
        !s.ok()) {
      return Invalid(absl::StrCat("boundaries: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateAck(const dynmo::v1::PlanAck& ack) {
  if (ack.epoch() == 0) return Invalid("ack for epoch 0");
  if (ack.state() != dynmo::v1::PlanAck::PREPARED &&
      ack.state() != dynmo::v1::PlanAck::APPLIED &&
      ack.state() != dynmo::v1::PlanAck::FAILED) {
    return Invalid("ack state must be PREPARED, APPLIED or FAILED");
  }
  if (ack.detail().size() > 4096) return Invalid("ack detail over 4096 bytes");
  return absl::OkStatus();
}

absl::Status ValidateRegisterHost(
    const dynmo::v1::RegisterHostRequest& request) {
  if (request.ranks_size() == 0) return Invalid("RegisterHost names no rank");
  if (request.ranks_size() > kMaxRanksPerJob) {
    return Invalid(absl::StrCat("RegisterHost names ", request.ranks_size(),
                                " ranks; the limit is ", kMaxRanksPerJob));
  }
  const dynmo::v1::RegisterRequest& first = request.ranks(0);
  absl::flat_hash_set<int> ranks;
  absl::flat_hash_set<std::pair<int, int>> coordinates;
  for (const auto& r : request.ranks()) {
    if (absl::Status s = ValidateRegister(r); !s.ok()) {
      return Invalid(absl::StrCat("rank ", r.rank(), ": ", s.message()));
    }
    if (r.job() != first.job()) {
      return Invalid(absl::StrCat("RegisterHost mixes jobs '", first.job(),
                                  "' and '", r.job(), "'"));
    }
    if (r.pipeline_size() != first.pipeline_size() ||
        r.data_parallel_size() != first.data_parallel_size() ||
        r.num_layers() != first.num_layers() ||
        r.model_fingerprint() != first.model_fingerprint()) {
      return Invalid(absl::StrCat(
          "rank ", r.rank(), " registers ", r.pipeline_size(), " stages x ",
          r.data_parallel_size(), " replicas x ", r.num_layers(),
          " layers of model '", r.model_fingerprint(), "', rank ", first.rank(),
          " ", first.pipeline_size(), " x ", first.data_parallel_size(), " x ",
          first.num_layers(), " of '", first.model_fingerprint(), "'"));
    }
    if (!ranks.insert(r.rank()).second) {
      return Invalid(absl::StrCat("rank ", r.rank(), " is listed twice"));
    }
    if (!coordinates.insert({r.pipeline_rank(), r.data_parallel_rank()})
             .second) {
      return Invalid(absl::StrCat("stage ", r.pipeline_rank(), " replica ",
                                  r.data_parallel_rank(),
                                  " is listed for two ranks"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateHostHello(const dynmo::v1::HostHello& hello) {
  if (absl::Status s = ValidateJobName(hello.job()); !s.ok()) return s;
  if (hello.host().empty() || hello.host().size() > 256) {
    return Invalid("HostHello.host must be 1..256 bytes");
  }
  if (!PrintableText(hello.host())) {
    return Invalid("HostHello.host holds a control character (printable text only)");
  }
  if (hello.ranks_size() == 0) return Invalid("HostHello names no rank");
  if (hello.ranks_size() > kMaxRanksPerJob) {
    return Invalid(absl::StrCat("HostHello names more than ", kMaxRanksPerJob,
                                " ranks"));
  }
  absl::flat_hash_set<int> seen;
  for (int r : hello.ranks()) {
    if (!seen.insert(r).second) {
      return Invalid(absl::StrCat("HostHello lists rank ", r, " twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dynmo::service
