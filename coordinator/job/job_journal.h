// JobJournal: where a JobMachine (job_machine.h) makes its record durable —
// the daemon's state keeper (service/state_store.h), or a replay's journal
// that keeps nothing (replay_target.cc). CommitJob returns once `record`
// survives a crash, or an error (nothing was changed then).
//
// Thread-safety: whatever the implementation says; the machine calls it
// under its shell's lock.
#ifndef DYNMO_COORDINATOR_JOB_JOB_JOURNAL_H_
#define DYNMO_COORDINATOR_JOB_JOB_JOURNAL_H_

#include "absl/status/status.h"
#include "dynmo/v1/state.pb.h"

namespace dynmo::service {

class JobJournal {
 public:
  virtual ~JobJournal() = default;
  virtual absl::Status CommitJob(const dynmo::v1::JobRecord& record) = 0;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_JOB_JOB_JOURNAL_H_
