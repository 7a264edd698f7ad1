#include "coordinator/service/delivery_order.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

// Records what reaches it, in one log shared by every sink of a test.
class LoggingSink : public SessionSink {
 public:
  LoggingSink(std::string name, std::vector<std::string>* log)
      : name_(std::move(name)), log_(log) {}
  void SendTo(absl::Span<const int> ranks,
              std::shared_ptr<const dynmo::v1::CoordinatorMessage> m) override {
    log_->push_back(name_ + " x" + std::to_string(ranks.size()));
    log_->push_back(name_ + " epoch " + std::to_string(m->abort().epoch()));
  }
  void Close(const absl::Status& s) override {
    log_->push_back(name_ + " closed: " + std::string(s.message()));
  }

 private:
  std::string name_;
  std::vector<std::string>* log_;
};

std::shared_ptr<const dynmo::v1::CoordinatorMessage> Abort(uint64_t epoch) {
  auto m = std::make_shared<dynmo::v1::CoordinatorMessage>();
  m->mutable_abort()->set_epoch(epoch);
  return m;
}

TEST(DeliveryOrderTest, DeliversWhenItGoesOutOfScopeClosingFirstEachSinkOnce) {
  DeliveryOrder order;
  std::vector<std::string> log;
  auto a = std::make_shared<LoggingSink>("a", &log);
  auto b = std::make_shared<LoggingSink>("b", &log);
  {
    Delivery delivery(&order);
    JobEffects first;
    first.sends.push_back({a, {0, 1}, Abort(1)});
    first.closes.push_back({b, absl::AbortedError("superseded by a newer session")});
    delivery.Take(first);
    JobEffects second;
    second.closes.push_back({b, absl::AbortedError("again")});  // once
    second.sends.push_back({a, {0}, Abort(2)});
    delivery.Take(second);
    EXPECT_TRUE(log.empty()) << "nothing leaves before the scope ends";
  }
  EXPECT_EQ(log, (std::vector<std::string>{
                     "b closed: superseded by a newer session", "a x2",
                     "a epoch 1", "a x1", "a epoch 2"}));
  log.clear();
  {
    Delivery nothing(&order);
    JobEffects none;
    nothing.Take(none);  // takes no turn: the next delivery is not held up
  }
  {
    Delivery next(&order);
    JobEffects third;
    third.sends.push_back({a, {0}, Abort(3)});
    next.Take(third);
  }
  EXPECT_EQ(log, (std::vector<std::string>{"a x1", "a epoch 3"}));
}

TEST(DeliveryOrderTest, ALaterTurnWaitsForTheEarlierOnes) {
  DeliveryOrder order;
  std::vector<std::string> log;
  auto a = std::make_shared<LoggingSink>("a", &log);
  // Turns taken as if under the job's lock, in the order the events ran.
  auto prepare = std::make_unique<Delivery>(&order);
  JobEffects first;
  first.sends.push_back({a, {0}, Abort(1)});
  prepare->Take(first);
  auto commit = std::make_unique<Delivery>(&order);
  JobEffects second;
  second.sends.push_back({a, {0}, Abort(2)});
  commit->Take(second);
  // The second turn's delivery starts first and must wait.
  std::thread late([&] { commit.reset(); });
  prepare.reset();
  late.join();
  EXPECT_EQ(log, (std::vector<std::string>{"a x1", "a epoch 1", "a x1", "a epoch 2"}));
}

}  // namespace
}  // namespace dynmo::service
