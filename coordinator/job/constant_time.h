// ConstantTimeEquals: a comparison of secrets (bearer tokens, session keys,
// the metrics login) that does not leak where they differ.
//
// Thread-safe (a pure function).
#ifndef DYNMO_COORDINATOR_JOB_CONSTANT_TIME_H_
#define DYNMO_COORDINATOR_JOB_CONSTANT_TIME_H_

#include "absl/strings/string_view.h"

namespace dynmo::service {

// Whether a presented secret equals the expected one, in time that depends
// only on the expected one's length (no early exit on the first mismatch):
// tokens, session keys, the metrics login.
bool ConstantTimeEquals(absl::string_view got, absl::string_view want);

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_CONSTANT_TIME_H_
