// The 1F1B executor's order of work: checked against the phases of the
// figure, and run across threads with rendezvous channels (a send completes
// only when its receive is posted, the strictest transport) to show the
// paired exchanges never deadlock.
#include "trainer/stage/one_f_one_b.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dynmo::trainer {
namespace {

// Records compute ops only ("F3", "B0").
class RecordingOps : public StageOps {
 public:
  std::vector<std::string> trace;
  absl::Status RecvForward(int) override { return absl::OkStatus(); }
  absl::Status Forward(int mb) override { return Log("F", mb); }
  absl::Status SendForward(int) override { return absl::OkStatus(); }
  absl::Status SendForwardRecvBackward(int, int) override { return absl::OkStatus(); }
  absl::Status Backward(int mb) override { return Log("B", mb); }
  absl::Status SendBackward(int) override { return absl::OkStatus(); }
  absl::Status SendBackwardRecvForward(int, int) override { return absl::OkStatus(); }
  absl::Status RecvBackward(int) override { return absl::OkStatus(); }

 private:
  absl::Status Log(const char* kind, int mb) {
    trace.push_back(absl::StrCat(kind, mb));
    return absl::OkStatus();
  }
};

std::vector<std::string> Trace(int stage, int stages, int m) {
  RecordingOps ops;
  EXPECT_TRUE(RunOneFOneB(stage, stages, m, ops).ok());
  return ops.trace;
}

TEST(OneFOneBTest, FirstStageWarmsUpWithPMinusOneForwards) {
  EXPECT_EQ(Trace(0, 4, 6),
            (std::vector<std::string>{"F0", "F1", "F2", "F3", "B0", "F4", "B1",
                                      "F5", "B2", "B3", "B4", "B5"}));
}

TEST(OneFOneBTest, LastStageAlternatesFromTheStart) {
  EXPECT_EQ(Trace(3, 4, 3),
            (std::vector<std::string>{"F0", "B0", "F1", "B1", "F2", "B2"}));
}

TEST(OneFOneBTest, FewerMicroBatchesThanStagesIsAllForwardsThenBackwards) {
  EXPECT_EQ(Trace(0, 4, 2), (std::vector<std::string>{"F0", "F1", "B0", "B1"}));
}

TEST(OneFOneBTest, EveryStageRunsEachMicroBatchOnceBackwardAfterForward) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 7; ++m) {
      for (int s = 0; s < p; ++s) {
        std::vector<std::string> t = Trace(s, p, m);
        ASSERT_EQ(static_cast<int>(t.size()), 2 * m);
        int forwards = 0, backwards = 0, peak = 0;
        for (const std::string& op : t) {
          if (op[0] == 'F') {
            EXPECT_EQ(op, absl::StrCat("F", forwards++));
          } else {
            EXPECT_EQ(op, absl::StrCat("B", backwards++));
            EXPECT_LE(backwards, forwards);
          }
          peak = std::max(peak, forwards - backwards);
        }
        // 1F1B's activation bound: stage s holds at most p - s micro-batches.
        EXPECT_LE(peak, std::min(p - s, m)) << "p=" << p << " m=" << m << " s=" << s;
      }
    }
  }
}

// Point-to-point channels between threads with rendezvous semantics: a send
// completes only when the matching receive is posted, the strictest
// transport. An exchange posts its halves, then waits for all of them, as
// Transport::Exchange does.
class Rendezvous {
 public:
  struct Op {
    bool is_send = false;
    int value = 0;       // sent value, or the value received
    bool done = false;
  };
  void Post(int from, int to, Op* op) {
    std::lock_guard<std::mutex> lock(mu_);
    Link& link = links_[{from, to}];
    (op->is_send ? link.sends : link.recvs).push_back(op);
    while (!link.sends.empty() && !link.recvs.empty()) {
      link.recvs.front()->value = link.sends.front()->value;
      link.sends.front()->done = link.recvs.front()->done = true;
      link.sends.erase(link.sends.begin());
      link.recvs.erase(link.recvs.begin());
    }
    cv_.notify_all();
  }
  bool Wait(const std::vector<Op*>& ops) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      for (Op* op : ops) {
        if (!op->done) return false;
      }
      return true;
    });
  }

 private:
  struct Link {
    std::vector<Op*> sends, recvs;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, Link> links_;
};

// Activations of micro-batch mb carry the value mb, gradients -(mb + 1), so
// a receive that matches the wrong message is caught.
class ChannelOps : public StageOps {
 public:
  ChannelOps(int stage, int stages, Rendezvous* net)
      : stage_(stage), stages_(stages), net_(net) {}

  absl::Status RecvForward(int mb) override { return Exchange({}, {{prev(), mb}}); }
  absl::Status Forward(int) override { return absl::OkStatus(); }
  absl::Status SendForward(int mb) override { return Exchange({{next(), mb}}, {}); }
  absl::Status SendForwardRecvBackward(int send_mb, int recv_mb) override {
    return Exchange({{next(), send_mb}}, {{next(), -(recv_mb + 1)}});
  }
  absl::Status Backward(int) override { return absl::OkStatus(); }
  absl::Status SendBackward(int mb) override {
    return Exchange({{prev(), -(mb + 1)}}, {});
  }
  absl::Status SendBackwardRecvForward(int send_mb, int recv_mb) override {
    return Exchange({{prev(), -(send_mb + 1)}}, {{prev(), recv_mb}});
  }
  absl::Status RecvBackward(int mb) override {
    return Exchange({}, {{next(), -(mb + 1)}});
  }

 private:
  // -1 is "no neighbour": the first stage has no prev, the last no next.
  int prev() const { return stage_ - 1; }
  int next() const { return stage_ + 1 < stages_ ? stage_ + 1 : -1; }

  // sends and receives as (peer, value / expected value).
  absl::Status Exchange(std::vector<std::pair<int, int>> sends,
                        std::vector<std::pair<int, int>> recvs) {
    std::vector<Rendezvous::Op> ops(sends.size() + recvs.size());
    std::vector<Rendezvous::Op*> posted;
    size_t k = 0;
    for (auto [peer, value] : sends) {
      if (peer < 0) continue;
      ops[k] = {true, value, false};
      net_->Post(stage_, peer, &ops[k]);
      posted.push_back(&ops[k++]);
    }
    std::vector<int> expected;
    for (auto [peer, value] : recvs) {
      if (peer < 0) continue;
      ops[k] = {false, 0, false};
      net_->Post(peer, stage_, &ops[k]);
      expected.push_back(value);
      posted.push_back(&ops[k++]);
    }
    if (!net_->Wait(posted)) {
      return absl::DeadlineExceededError(absl::StrCat("stage ", stage_, " deadlocked"));
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      const int got = posted[posted.size() - expected.size() + i]->value;
      if (got != expected[i]) {
        return absl::InternalError(absl::StrCat("stage ", stage_, " expected ",
                                                expected[i], " got ", got));
      }
    }
    return absl::OkStatus();
  }

  int stage_;
  int stages_;
  Rendezvous* net_;
};

TEST(OneFOneBTest, NeighbouringStagesNeverDeadlockOnRendezvousChannels) {
  for (int p = 1; p <= 5; ++p) {
    for (int m = 1; m <= 6; ++m) {
      Rendezvous net;
      std::vector<absl::Status> results(p);
      std::vector<std::thread> threads;
      for (int s = 0; s < p; ++s) {
        threads.emplace_back([&, s] {
          ChannelOps ops(s, p, &net);
          results[s] = RunOneFOneB(s, p, m, ops);
        });
      }
      for (auto& t : threads) t.join();
      for (int s = 0; s < p; ++s) {
        EXPECT_TRUE(results[s].ok()) << "p=" << p << " m=" << m << ": " << results[s];
      }
    }
  }
}

}  // namespace
}  // namespace dynmo::trainer
