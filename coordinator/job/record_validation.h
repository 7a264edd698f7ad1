// ValidateJobRecord: a stored job record (state.proto JobRecord, read back
// from --state_dir) checked like a request before a job is built from it.
// A record is bytes on a disk an attacker, a bit flip or an older bug may
// have changed; a job built from a bad one crashes the daemon (a shape of
// 2^30 ranks allocates without bound) or bricks the job (a layout its
// ranks never ran). The record must pass what a Register of its shape
// passes (validation.h: sizes, coordinates, boundaries, epochs), and hold
// together: the applied epoch at most the newest issued, every plan's epoch
// issued, the ranks inside the job's shape, progress figures finite. A
// tombstone (a deleted job's name kept for its owner) holds only a name
// and an owner.
//
// Pure and thread-safe.
#ifndef DYNMO_COORDINATOR_JOB_RECORD_VALIDATION_H_
#define DYNMO_COORDINATOR_JOB_RECORD_VALIDATION_H_

#include "absl/status/status.h"
#include "dynmo/v1/agent.pb.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

// OK, or INVALID_ARGUMENT saying what in the record is out of bounds.
absl::Status ValidateJobRecord(const dynmo::v1::JobRecord& record);

// The registration a record's shape stands for (rank 0, its applied epoch
// and layout): what the shape limits of a coordinator are checked on.
dynmo::v1::RegisterRequest RegistrationOf(const dynmo::v1::JobRecord& record);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_RECORD_VALIDATION_H_
