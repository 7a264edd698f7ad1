// DeliveryOrder: the turns one job's deliveries take. The job's messages
// leave after its lock is released (gRPC may run a session's OnDone inline,
// which detaches from the job; a broadcast to thousands of sessions must not
// stall the job's reports), yet in the order the job produced them, so a
// COMMIT never overtakes its PREPARE: a turn is taken under the job's lock,
// with the effects, and the delivery waits for the turns before it.
//
// Thread-safe. A turn is taken under the owner's lock (Delivery::Take) and
// run without it (~Delivery); lock order: the delivery lock is never held
// while taking the owner's.
#ifndef DYNMO_COORDINATOR_SERVICE_DELIVERY_ORDER_H_
#define DYNMO_COORDINATOR_SERVICE_DELIVERY_ORDER_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job/job_effects.h"

namespace dynmo::service {

// The job's turns: handed out by Delivery::Take under the owner's lock, so
// turns follow the order the owner's events ran in, and run by ~Delivery
// once every earlier turn has run. Every turn taken is run.
class DeliveryOrder {
 private:
  friend class Delivery;
  uint64_t taken_ = 0;  // under the owner's lock
  absl::Mutex mu_;
  absl::CondVar turn_done_;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
};

// One call's closes and messages, delivered in their turn when it goes out
// of scope: declared before the owner's MutexLock, it runs after the lock is
// released. Not thread-safe (one call's).
class Delivery {
 public:
  explicit Delivery(DeliveryOrder* order) : order_(order) {}
  Delivery(const Delivery&) = delete;
  Delivery& operator=(const Delivery&) = delete;
  // Waits for the job's earlier turns, then closes and sends.
  ~Delivery();
  // Takes `effects`' closes (each sink once) and sends, and a turn for them
  // the first time there are any. Under the owner's lock.
  void Take(JobEffects& effects);

 private:
  DeliveryOrder* const order_;
  uint64_t turn_ = 0;  // 0: nothing to deliver
  std::vector<JobEffects::Close> closes_;
  std::vector<JobEffects::Send> sends_;
};

}  // namespace dynmo::service

#endif  // DYNMO_COORDINATOR_SERVICE_DELIVERY_ORDER_H_
