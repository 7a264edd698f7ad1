// The NCCL test double (trainer/comm/nccl_double.h) in-process: two ranks
// on two threads, real Gloo groups over one in-process store underneath.
// It proves the double fails the way NCCL would (poison read through the
// per-op Works of a coalesced batch — the shape of the old Exchange —,
// refused pairings) and that the transport's Exchange (p2p_batch.h) passes
// under it, staging every tensor and copying a receive back only after its
// batch completed.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/comm/nccl_double.h"
#include "trainer/comm/p2p_batch.h"
#include "trainer/comm/process_group_transport.h"
#include "trainer/comm/transport.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

// Gloo groups of two wrapped in the double, one per rank, as dynmo-train
// --backend=nccl-double builds them (every tensor staged, as on NCCL).
std::shared_ptr<ProcessGroupBackend> DoubleBackend() {
  auto backend = std::make_shared<ProcessGroupBackend>();
  backend->name = "nccl-double";
  backend->stage_always = true;
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(30));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  backend->make_group = [options](c10::intrusive_ptr<c10d::Store> s, int rank, int size) {
    return MakeNcclDouble(c10::make_intrusive<c10d::ProcessGroupGloo>(std::move(s), rank,
                                                                      size, options));
  };
  backend->timeout = std::chrono::seconds(30);
  return backend;
}

// Runs body(rank, group) on ranks 0 and 1 at once over a fresh store.
void OnTwoRanks(const std::function<void(int, c10d::Backend&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto backend = DoubleBackend();
  auto run = [&](int rank) {
    auto group = backend->make_group(
        c10::make_intrusive<c10d::PrefixStore>("pair", store), rank, 2);
    body(rank, *group);
  };
  std::thread peer(run, 1);
  run(0);
  peer.join();
}

// Runs body(rank, transport) on ranks 0 and 1 of a world of two.
void OnTwoTransports(const std::function<void(int, Transport&)>& body,
                     std::shared_ptr<const ProcessGroupBackend> backend = DoubleBackend()) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto run = [&](int rank) {
    absl::StatusOr<std::unique_ptr<Transport>> t =
        ConnectProcessGroups(backend, store, -1, rank, 2, 1, 0);
    ASSERT_TRUE(t.ok()) << t.status();
    body(rank, **t);
  };
  std::thread peer(run, 1);
  run(0);
  peer.join();
}

// The double behind a recorder of the buffers a caller hands it to receive
// into, so a test tells the transport's staged buffers from its callers'
// tensors.
class ReceiveRecorder : public c10d::Backend {
 public:
  ReceiveRecorder(c10::intrusive_ptr<c10d::Backend> inner, std::vector<const void*>* buffers)
      : Backend(inner->getRank(), inner->getSize()),
        inner_(std::move(inner)),
        buffers_(buffers) {}
  const std::string getBackendName() const override { return inner_->getBackendName(); }
  bool supportsCoalescing() const override { return inner_->supportsCoalescing(); }
  void startCoalescing() override { inner_->startCoalescing(); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override { return inner_->endCoalescing(); }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst,
                                      int tag) override {
    return inner_->send(tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src,
                                      int tag) override {
    buffers_->push_back(tensors[0].data_ptr());
    return inner_->recv(tensors, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return inner_->barrier(opts);
  }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
  std::vector<const void*>* buffers_;
};

bool AllPoison(const at::Tensor& t) {
  return t.detach().view(at::kByte).eq(0xFF).all().item<bool>();
}

TEST(NcclDoubleTest, TheOldExchangeShapeReadsPoisonThroughThePerOpWorks) {
  // The old Exchange: open a group, post, close it, wait on each op's Work,
  // read. NCCL completes the batch only through endCoalescing's Work.
  at::Tensor got[2];
  OnTwoRanks([&](int rank, c10d::Backend& group) {
    std::vector<at::Tensor> out = {torch::full({4}, 10.0f + rank)};
    std::vector<at::Tensor> in = {torch::zeros({4})};
    std::vector<at::Tensor> size_in = {torch::zeros({1}, torch::kLong)};
    std::vector<at::Tensor> size_out = {torch::full({1}, 4, torch::kLong)};
    group.startCoalescing();
    std::vector<c10::intrusive_ptr<c10d::Work>> per_op = {
        group.send(size_out, 1 - rank, 0), group.recv(size_in, 1 - rank, 0),
        group.send(out, 1 - rank, 0), group.recv(in, 1 - rank, 0)};
    group.endCoalescing();  // the old groupEnd: its Work dropped
    for (auto& w : per_op) w->wait();
    got[rank] = in[0];
    // RecvLayerState's header size read this way is -1, never the 4 sent.
    EXPECT_EQ(size_in[0].item<int64_t>(), -1);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(AllPoison(got[r])) << got[r];
    EXPECT_TRUE(torch::isnan(got[r]).all().item<bool>());
  }
}

TEST(NcclDoubleTest, AReceiveLandsOnlyWhenTheCoalescedWorkIsWaitedOn) {
  OnTwoRanks([](int rank, c10d::Backend& group) {
    std::vector<at::Tensor> out = {torch::full({3}, 1.5f + rank)};
    // A leaf that requires grad, as a pipeline stage's input buffer: NCCL
    // writes it as raw memory, and so does the double.
    std::vector<at::Tensor> in = {torch::zeros({3}).requires_grad_()};
    c10::intrusive_ptr<c10d::Work> batch;
    {
      CoalescingGroup coalesced(group);
      group.send(out, 1 - rank, 0);
      group.recv(in, 1 - rank, 0);
      batch = coalesced.End();
    }
    EXPECT_TRUE(AllPoison(in[0]));
    batch->wait();
    EXPECT_TRUE(torch::equal(in[0], torch::full({3}, 1.5f + (1 - rank))));
  });
}

TEST(NcclDoubleTest, ExchangeDeliversBothDirectionsAndEveryDtype) {
  OnTwoTransports([](int rank, Transport& transport) {
    const int peer = 1 - rank;
    at::Tensor activations = torch::arange(6, torch::kFloat).mul(rank + 1).reshape({2, 3});
    at::Tensor count = torch::full({1}, 100 + rank, torch::kLong);
    at::Tensor got_activations = torch::empty({2, 3});
    at::Tensor got_count = torch::empty({1}, torch::kLong);
    std::vector<P2POp> ops = {{P2POp::Kind::kSend, &activations, peer},
                              {P2POp::Kind::kSend, &count, peer},
                              {P2POp::Kind::kRecv, &got_activations, peer},
                              {P2POp::Kind::kRecv, &got_count, peer}};
    ASSERT_TRUE(transport.Exchange(ops).ok());
    EXPECT_TRUE(torch::equal(got_activations,
                             torch::arange(6, torch::kFloat).mul(peer + 1).reshape({2, 3})));
    EXPECT_EQ(got_count.item<int64_t>(), 100 + peer);
    // Collectives go straight through.
    at::Tensor sum = torch::full({2}, rank + 1.0f);
    ASSERT_TRUE(transport.AllReduceSumWorld(sum).ok());
    EXPECT_TRUE(torch::equal(sum, torch::full({2}, 3.0f)));
    ASSERT_TRUE(transport.Barrier().ok());
  });
}

TEST(NcclDoubleTest, ExchangeStagesReceivesAndCopiesThemBackOnlyAfterTheBatchCompleted) {
  // Under the double the transport receives into buffers of its own, as it
  // does for CPU tensors on NCCL, and the double keeps them poisoned until
  // the batch's Work is waited on: a copy back ahead of that wait would
  // hand the caller NaN and -1.
  std::vector<const void*> handed[2];
  auto recording = std::make_shared<ProcessGroupBackend>(*DoubleBackend());
  recording->make_group = [inner = recording->make_group, &handed](
                              c10::intrusive_ptr<c10d::Store> s, int rank, int size) {
    return c10::intrusive_ptr<c10d::Backend>(
        c10::make_intrusive<ReceiveRecorder>(inner(std::move(s), rank, size), &handed[rank]));
  };
  at::Tensor got_values[2];
  at::Tensor got_count[2];
  OnTwoTransports(
      [&](int rank, Transport& transport) {
        const int peer = 1 - rank;
        at::Tensor values = torch::linspace(0, 1, 8).add(rank);
        at::Tensor count = torch::full({1}, 7 + rank, torch::kLong);
        got_values[rank] = torch::zeros({8});
        got_count[rank] = torch::zeros({1}, torch::kLong);
        std::vector<P2POp> ops = {{P2POp::Kind::kSend, &values, peer},
                                  {P2POp::Kind::kSend, &count, peer},
                                  {P2POp::Kind::kRecv, &got_values[rank], peer},
                                  {P2POp::Kind::kRecv, &got_count[rank], peer}};
        ASSERT_TRUE(transport.Exchange(ops).ok());
      },
      recording);
  for (int r = 0; r < 2; ++r) {
    const int peer = 1 - r;
    ASSERT_EQ(handed[r].size(), 2u);
    for (const void* buffer : handed[r]) {
      EXPECT_NE(buffer, got_values[r].data_ptr());
      EXPECT_NE(buffer, got_count[r].data_ptr());
    }
    EXPECT_TRUE(torch::equal(got_values[r], torch::linspace(0, 1, 8).add(peer)))
        << got_values[r];
    EXPECT_EQ(got_count[r].item<int64_t>(), 7 + peer);
  }
}

TEST(NcclDoubleTest, OpsThatDoNotPairInTheSameOrderAreRefusedOnBothRanks) {
  absl::Status status[2];
  OnTwoTransports([&](int rank, Transport& transport) {
    at::Tensor small = torch::zeros({4});
    at::Tensor large = torch::zeros({8});
    // Rank 0 sends small then large; rank 1 receives large then small.
    std::vector<P2POp> ops =
        rank == 0 ? std::vector<P2POp>{{P2POp::Kind::kSend, &small, 1},
                                       {P2POp::Kind::kSend, &large, 1}}
                  : std::vector<P2POp>{{P2POp::Kind::kRecv, &large, 0},
                                       {P2POp::Kind::kRecv, &small, 0}};
    status[rank] = transport.Exchange(ops);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kUnavailable) << status[r];
    EXPECT_THAT(status[r].message(),
                HasSubstr("rank 0's send #0 to rank 1 carries 16 bytes of Float, rank 1's "
                          "receive #0 from rank 0 expects 32 bytes of Float"));
  }
}

TEST(NcclDoubleTest, AMissingReceiveIsRefusedNotDelivered) {
  absl::Status status[2];
  OnTwoTransports([&](int rank, Transport& transport) {
    at::Tensor a = torch::zeros({2});
    at::Tensor b = torch::zeros({2});
    std::vector<P2POp> ops =
        rank == 0 ? std::vector<P2POp>{{P2POp::Kind::kSend, &a, 1},
                                       {P2POp::Kind::kSend, &b, 1}}
                  : std::vector<P2POp>{{P2POp::Kind::kRecv, &a, 0}};
    status[rank] = transport.Exchange(ops);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(status[r].message(),
                HasSubstr("rank 0 sends 2 tensors to rank 1 in this batch, which receives 1"))
        << status[r];
  }
}

}  // namespace
}  // namespace dynmo::trainer
