#include "coordinator/service/send_queue.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace dynmo::service {
namespace {

// Records what reaches it, in one log shared by every sink of a test.
class LoggingSink : public SessionSink {
 public:
  LoggingSink(std::string name, std::vector<std::string>* log)
      : name_(std::move(name)), log_(log) {}
  void Send(std::shared_ptr<const dynmo::v1::CoordinatorMessage> m) override {
    log_->push_back(name_ + " epoch " + std::to_string(m->abort().epoch()));
  }
  void SendTo(absl::Span<const int> ranks,
              std::shared_ptr<const dynmo::v1::CoordinatorMessage> m) override {
    log_->push_back(name_ + " x" + std::to_string(ranks.size()));
    Send(std::move(m));
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

TEST(SendQueueTest, DeliversOutsideTheOwnersLockInOrderClosingFirst) {
  absl::Mutex owner;
  SendQueue queue(&owner);
  std::vector<std::string> log;
  auto a = std::make_shared<LoggingSink>("a", &log);
  auto b = std::make_shared<LoggingSink>("b", &log);
  {
    absl::MutexLock lock(&owner);
    queue.Queue(a, {0, 1}, Abort(1));
    queue.Close(b);
    queue.Close(b);  // once
    queue.Queue(a, {0}, Abort(2));
  }
  EXPECT_TRUE(log.empty()) << "nothing leaves before Deliver";
  queue.Deliver();  // takes the owner's lock itself: must not be held here
  EXPECT_EQ(log, (std::vector<std::string>{
                     "b closed: superseded by a newer session", "a x2",
                     "a epoch 1", "a x1", "a epoch 2"}));
  log.clear();
  queue.Deliver();
  EXPECT_TRUE(log.empty()) << "delivered once";
}

}  // namespace
}  // namespace dynmo::service
