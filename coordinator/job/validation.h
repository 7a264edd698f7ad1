// Validation of what arrives over the wire, before anything touches state.
// (An iteration report is read and checked in one pass by
// wire/report_codec.h.) Each function checks one message on its own (shape, ranges, NaN,
// sizes) and returns INVALID_ARGUMENT naming the offending field; checks
// that need a job's state (does the rank exist, does the layer count match)
// live in JobState and return FAILED_PRECONDITION or NOT_FOUND.
#ifndef DYNMO_COORDINATOR_JOB_VALIDATION_H_
#define DYNMO_COORDINATOR_JOB_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/operator.pb.h"
#include "wire/limits.h"

namespace dynmo::service {

inline constexpr int kMaxJobNameChars = 128;
inline constexpr int kMaxRanksPerJob = 1 << 16;
inline constexpr int kMaxLayers = 1 << 16;
// The coordinator keeps one cost per (data-parallel replica, layer): a job
// asks for at most this many (a 60-byte Register of dp = layers = 65536
// would otherwise allocate ~240 GB).
inline constexpr int64_t kMaxReplicaLayers = int64_t{1} << 20;
// Sanity bounds on what a rank sends (wire/limits.h; the report reader,
// wire/report_codec.h, applies them to iteration reports).
using wire::kMaxBytes;
using wire::kMaxEpoch;
using wire::kMaxIteration;
using wire::kMaxLayerSeconds;

// A job name: 1..128 chars of [A-Za-z0-9._-].
absl::Status ValidateJobName(absl::string_view name);

// Self-consistency of a registration (sizes, coordinates, boundaries).
absl::Status ValidateRegister(const dynmo::v1::RegisterRequest& request);

absl::Status ValidateAck(const dynmo::v1::PlanAck& ack);

// A RegisterHost request: 1..kMaxRanksPerJob registrations, each valid on
// its own, all of one job and one job shape (sizes, layers, fingerprint),
// with distinct ranks and distinct (stage, replica) coordinates.
absl::Status ValidateRegisterHost(const dynmo::v1::RegisterHostRequest& request);

// A HostSession hello: a job name, a host name (1..256 bytes) and 1 or more
// distinct ranks.
absl::Status ValidateHostHello(const dynmo::v1::HostHello& hello);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_VALIDATION_H_
