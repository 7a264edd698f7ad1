#include "trainer/comm/nccl_double.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {
namespace {

// Gloo tags of the pairing check, apart from the callers' data tags.
constexpr int kCountTag = 1 << 20;
constexpr int kListTag = kCountTag + 1;

// A contiguous tensor's memory as bytes, outside autograd: NCCL (and Gloo)
// write a receive there as raw memory, so a leaf that requires grad (the
// input buffer of a pipeline stage) takes it and its version stays.
at::Tensor RawBytes(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(t.nbytes())},
                       at::TensorOptions(at::kByte));
}

void Poison(const at::Tensor& t) {
  if (t.numel() == 0) return;
  RawBytes(t).fill_(0xFF);
}

// NCCL's per-op Work inside a group: its end event was recorded before the
// kernel launched, so waiting on it orders nothing.
class NeverCompletedWork : public c10d::Work {
 public:
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  bool isCompleted() override { return false; }
};

// The Work that completes a batch: the received bytes are staged; wait()
// copies them into the caller's buffers.
class DeliveringWork : public c10d::Work {
 public:
  // (staged, destination) per receive.
  explicit DeliveringWork(std::vector<std::pair<at::Tensor, at::Tensor>> receives)
      : receives_(std::move(receives)) {}
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    if (!delivered_) {
      for (auto& [staged, destination] : receives_) {
        if (destination.numel() > 0) RawBytes(destination).copy_(RawBytes(staged));
      }
      delivered_ = true;
      finish();
    }
    return true;
  }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> receives_;
  bool delivered_ = false;
};

struct Op {
  bool send = true;
  at::Tensor tensor;
  int peer = 0;
  int tag = 0;
};

// What NCCL matches of an op: its count of bytes and its type.
struct Shape {
  int64_t bytes = 0;
  int64_t dtype = 0;
  bool operator==(const Shape& o) const { return bytes == o.bytes && dtype == o.dtype; }
};

std::string Describe(const Shape& s) {
  return absl::StrCat(s.bytes, " bytes of ",
                      c10::toString(static_cast<c10::ScalarType>(s.dtype)));
}

class NcclDouble : public c10d::Backend {
 public:
  explicit NcclDouble(c10::intrusive_ptr<c10d::Backend> carrier)
      : Backend(carrier->getRank(), carrier->getSize()), carrier_(std::move(carrier)) {}

  const std::string getBackendName() const override { return "nccl-double"; }
  bool supportsCoalescing() const override { return true; }

  void startCoalescing() override {
    TORCH_CHECK(!coalescing_, "nccl-double: startCoalescing inside a coalescing group");
    coalescing_ = true;
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    TORCH_CHECK(coalescing_, "nccl-double: endCoalescing without startCoalescing");
    coalescing_ = false;
    std::vector<Op> ops = std::move(queued_);
    queued_.clear();
    return Run(ops);
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override {
    return Queue(Op{true, Single(tensors), dst, tag});
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override {
    at::Tensor t = Single(tensors);
    Poison(t);
    return Queue(Op{false, t, src, tag});
  }

  // The collectives torch.distributed, DDP and our transport issue, each
  // completed by the carrier's Work.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    NotInGroup("broadcast");
    return carrier_->broadcast(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    NotInGroup("allreduce");
    return carrier_->allreduce(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override {
    NotInGroup("allreduce_coalesced");
    return carrier_->allreduce_coalesced(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    NotInGroup("reduce");
    return carrier_->reduce(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out,
                                           std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& opts) override {
    NotInGroup("allgather");
    return carrier_->allgather(out, in, opts);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& opts) override {
    NotInGroup("all_gather_into_tensor");
    return carrier_->_allgather_base(out, in, opts);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out,
                                        std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& opts) override {
    NotInGroup("gather");
    return carrier_->gather(out, in, opts);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out,
                                         std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& opts) override {
    NotInGroup("scatter");
    return carrier_->scatter(out, in, opts);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
      const c10d::ReduceScatterOptions& opts) override {
    NotInGroup("reduce_scatter");
    return carrier_->reduce_scatter(out, in, opts);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
    NotInGroup("reduce_scatter_tensor");
    return carrier_->_reduce_scatter_base(out, in, opts);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& out_counts,
                                               std::vector<int64_t>& in_counts,
                                               const c10d::AllToAllOptions& opts) override {
    NotInGroup("all_to_all_single");
    return carrier_->alltoall_base(out, in, out_counts, in_counts, opts);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    NotInGroup("barrier");
    return carrier_->barrier(opts);
  }

  void setTimeout(std::chrono::milliseconds timeout) override {
    carrier_->setTimeout(timeout);
  }

 private:
  static at::Tensor Single(const std::vector<at::Tensor>& tensors) {
    TORCH_CHECK(tensors.size() == 1, "nccl-double: one tensor per op");
    TORCH_CHECK(tensors[0].device().is_cpu() && tensors[0].is_contiguous(),
                "nccl-double: point-to-point tensors must be contiguous CPU tensors");
    return tensors[0];
  }

  void NotInGroup(const char* what) const {
    TORCH_CHECK(!coalescing_, "nccl-double: ", what, " inside a coalescing group");
  }

  c10::intrusive_ptr<c10d::Work> Queue(Op op) {
    if (coalescing_) {
      queued_.push_back(std::move(op));
      return c10::make_intrusive<NeverCompletedWork>();
    }
    return Run({std::move(op)});  // outside a group, an op's own Work completes it
  }

  static void WaitAll(const std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
    for (const auto& w : works) w->wait();
  }

  // Moves the batch's bytes; the receives stay staged until the Work is
  // waited on.
  c10::intrusive_ptr<c10d::Work> Run(const std::vector<Op>& ops) {
    CheckPairing(ops);
    std::vector<c10::intrusive_ptr<c10d::Work>> pending;
    std::vector<std::pair<at::Tensor, at::Tensor>> receives;
    for (const Op& op : ops) {
      std::vector<at::Tensor> one = {op.send ? op.tensor : at::empty_like(op.tensor)};
      if (op.send) {
        pending.push_back(carrier_->send(one, op.peer, op.tag));
      } else {
        pending.push_back(carrier_->recv(one, op.peer, op.tag));
        receives.emplace_back(one[0], op.tensor);
      }
    }
    WaitAll(pending);
    return c10::make_intrusive<DeliveringWork>(std::move(receives));
  }

  // Both ranks of every pair swap their op lists (count first, then
  // {send?, bytes, dtype} per op) and check the same pairing, so both
  // refuse a mismatch.
  void CheckPairing(const std::vector<Op>& ops) {
    std::map<int, std::vector<int64_t>> mine;
    for (const Op& op : ops) {
      TORCH_CHECK(op.peer >= 0 && op.peer < getSize() && op.peer != getRank(),
                  "nccl-double: rank ", getRank(), " has no peer ", op.peer);
      mine[op.peer].insert(mine[op.peer].end(),
                           {op.send ? 1 : 0, static_cast<int64_t>(op.tensor.nbytes()),
                            static_cast<int64_t>(op.tensor.scalar_type())});
    }
    std::map<int, at::Tensor> counts;
    std::vector<c10::intrusive_ptr<c10d::Work>> pending;
    for (auto& [peer, list] : mine) {
      std::vector<at::Tensor> out = {at::full({1}, static_cast<int64_t>(list.size()), at::kLong)};
      std::vector<at::Tensor> in = {at::empty({1}, at::kLong)};
      pending.push_back(carrier_->send(out, peer, kCountTag));
      pending.push_back(carrier_->recv(in, peer, kCountTag));
      counts[peer] = in[0];
    }
    WaitAll(pending);
    pending.clear();
    std::map<int, at::Tensor> theirs;
    for (auto& [peer, list] : mine) {
      std::vector<at::Tensor> out = {
          at::from_blob(list.data(), {static_cast<int64_t>(list.size())}, at::kLong)};
      // host-sync(cpu): the CPU test double of NCCL (Gloo underneath)
      std::vector<at::Tensor> in = {at::empty({counts[peer].item<int64_t>()}, at::kLong)};
      pending.push_back(carrier_->send(out, peer, kListTag));
      pending.push_back(carrier_->recv(in, peer, kListTag));
      theirs[peer] = in[0];
    }
    WaitAll(pending);
    for (auto& [peer, list] : mine) {
      const at::Tensor& other = theirs[peer];
      std::vector<int64_t> their(other.data_ptr<int64_t>(),
                                 other.data_ptr<int64_t>() + other.numel());
      CheckDirection(list, their, getRank(), peer);
      CheckDirection(their, list, peer, getRank());
    }
  }

  // The sends of `from` to `to` against the receives of `to` from `from`.
  static void CheckDirection(const std::vector<int64_t>& from_ops,
                             const std::vector<int64_t>& to_ops, int from, int to) {
    auto pick = [](const std::vector<int64_t>& list, bool send) {
      std::vector<Shape> out;
      for (size_t i = 0; i + 3 <= list.size(); i += 3) {
        if ((list[i] == 1) == send) out.push_back(Shape{list[i + 1], list[i + 2]});
      }
      return out;
    };
    const std::vector<Shape> sends = pick(from_ops, true);
    const std::vector<Shape> receives = pick(to_ops, false);
    const size_t n = std::min(sends.size(), receives.size());
    for (size_t k = 0; k < n; ++k) {
      if (!(sends[k] == receives[k])) {
        C10_THROW_ERROR(DistBackendError,
                        absl::StrCat("nccl-double: point-to-point ops do not pair: rank ",
                                     from, "'s send #", k, " to rank ", to, " carries ",
                                     Describe(sends[k]), ", rank ", to, "'s receive #",
                                     k, " from rank ", from, " expects ",
                                     Describe(receives[k]),
                                     " (NCCL would hang or deliver the wrong bytes)"));
      }
    }
    if (sends.size() != receives.size()) {
      C10_THROW_ERROR(DistBackendError,
                      absl::StrCat("nccl-double: point-to-point ops do not pair: rank ",
                                   from, " sends ", sends.size(), " tensors to rank ", to,
                                   " in this batch, which receives ", receives.size(),
                                   " (NCCL would hang)"));
    }
  }

  c10::intrusive_ptr<c10d::Backend> carrier_;
  bool coalescing_ = false;
  std::vector<Op> queued_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> MakeNcclDouble(
    c10::intrusive_ptr<c10d::Backend> carrier) {
  return c10::make_intrusive<NcclDouble>(std::move(carrier));
}

}  // namespace dynmo::trainer
