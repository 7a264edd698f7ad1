// PostPointToPoint: one batch of point-to-point ops on a c10d group, with
// PyTorch's own completion semantics (what torch.distributed's
// batch_isend_irecv does, reached through c10d::Backend so no caller names
// NCCL):
//   - on a backend that supportsCoalescing() (NCCL), the ops are issued
//     between startCoalescing() and endCoalescing(), and only the Work that
//     endCoalescing() returns completes them. The per-op Works of a
//     coalesced batch record their end before NCCL launches the fused
//     kernel at the group's end (pytorch#82450), so waiting on them orders
//     nothing: a receive read after such a wait may not have landed.
//   - on a backend without coalescing (Gloo), every op is posted before any
//     is waited on, so a send and a receive in opposite directions between
//     the same two ranks cannot deadlock, and each op's Work completes it.
// CoalescingGroup closes the group when an exception unwinds mid-batch, so
// a failed post never leaves every later op of the group swallowed into it.
//
// Completing: WaitForBatch calls Work::wait() with no timeout. On NCCL that
// is stream ordering (the current stream waits for the NCCL stream; the
// host does not block and the watchdog owns the timeout); on Gloo it blocks
// the host, bounded by the group's own timeout. The host blocks on a GPU
// result only where it reads one (a copy into CPU memory); after such a
// read, RethrowIfFailed surfaces an error the NCCL watchdog recorded on the
// Work (a timed-out or aborted peer), which a plain copy would not.
// Not thread-safe: one thread drives a group.
#ifndef DYNMO_TRAINER_COMM_P2P_BATCH_H_
#define DYNMO_TRAINER_COMM_P2P_BATCH_H_

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <vector>

#include "absl/types/span.h"
#include "trainer/comm/transport.h"

namespace dynmo::trainer {

// Brackets ops on `group` between startCoalescing() and endCoalescing().
// End() returns the Work that completes the batch (null when the backend
// queued nothing); when End() was never reached, the destructor ends the
// group and drops its Work: the caller is already reporting an error.
class CoalescingGroup {
 public:
  explicit CoalescingGroup(c10d::Backend& group);
  ~CoalescingGroup();
  CoalescingGroup(const CoalescingGroup&) = delete;
  CoalescingGroup& operator=(const CoalescingGroup&) = delete;
  c10::intrusive_ptr<c10d::Work> End();

 private:
  c10d::Backend& group_;
  bool open_ = true;
};

// Issues `ops` on `group`, op i on `buffers[i]` (one tensor each, where the
// backend wants it), tagged `tag`, and returns the Works that complete the
// batch: the coalesced one, or one per op. Throws what c10d throws.
std::vector<c10::intrusive_ptr<c10d::Work>> PostPointToPoint(
    c10d::Backend& group, absl::Span<const P2POp> ops,
    std::vector<std::vector<at::Tensor>>& buffers, int tag);

// Work::wait() on each (stream ordering on NCCL; see above).
void WaitForBatch(absl::Span<const c10::intrusive_ptr<c10d::Work>> works);

// Rethrows the exception a Work carries (a timed-out or aborted NCCL
// communicator, recorded by the watchdog); call after the host read.
void RethrowIfFailed(c10d::Work& work);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_COMM_P2P_BATCH_H_
