#include "trainer/comm/p2p_batch.h"

#include <exception>

namespace dynmo::trainer {

CoalescingGroup::CoalescingGroup(c10d::Backend& group) : group_(group) {
  group_.startCoalescing();
}

CoalescingGroup::~CoalescingGroup() {
  if (!open_) return;
  try {
    group_.endCoalescing();
  } catch (...) {
    // The batch already failed; its first error is the one reported.
  }
}

c10::intrusive_ptr<c10d::Work> CoalescingGroup::End() {
  open_ = false;
  return group_.endCoalescing();
}

std::vector<c10::intrusive_ptr<c10d::Work>> PostPointToPoint(
    c10d::Backend& group, absl::Span<const P2POp> ops,
    std::vector<std::vector<at::Tensor>>& buffers, int tag) {
  auto post = [&](size_t i) {
    return ops[i].kind == P2POp::Kind::kSend
               ? group.send(buffers[i], ops[i].peer, tag)
               : group.recv(buffers[i], ops[i].peer, tag);
  };
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  if (group.supportsCoalescing()) {
    CoalescingGroup batch(group);
    // The per-op Works complete nothing (see the header): dropped.
    for (size_t i = 0; i < ops.size(); ++i) post(i);
    if (c10::intrusive_ptr<c10d::Work> all = batch.End()) works.push_back(std::move(all));
    return works;
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (c10::intrusive_ptr<c10d::Work> w = post(i)) works.push_back(std::move(w));
  }
  return works;
}

void WaitForBatch(absl::Span<const c10::intrusive_ptr<c10d::Work>> works) {
  for (const c10::intrusive_ptr<c10d::Work>& work : works) work->wait();
}

void RethrowIfFailed(c10d::Work& work) {
  work.isCompleted();  // NCCL: picks up what the watchdog recorded
  if (std::exception_ptr e = work.exception()) std::rethrow_exception(e);
}

}  // namespace dynmo::trainer
