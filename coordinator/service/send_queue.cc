#include "coordinator/service/send_queue.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"

namespace dynmo::service {

void SendQueue::Queue(
    std::shared_ptr<SessionSink> sink, std::vector<int> ranks,
    std::shared_ptr<const dynmo::v1::CoordinatorMessage> message) {
  sends_.push_back(PendingSend{std::move(sink), std::move(ranks), std::move(message)});
  pending_.store(true, std::memory_order_release);
}

void SendQueue::Close(const std::shared_ptr<SessionSink>& sink, absl::Status why) {
  // A multiplexed session may be replaced for several ranks at once.
  for (const auto& c : closes_) {
    if (c.first == sink) return;
  }
  closes_.emplace_back(sink, std::move(why));
  pending_.store(true, std::memory_order_release);
}

void SendQueue::Deliver() {
  if (!pending_.load(std::memory_order_acquire)) return;  // the hot path
  absl::MutexLock deliver_lock(&deliver_mu_);
  std::vector<PendingSend> batch;
  std::vector<std::pair<std::shared_ptr<SessionSink>, absl::Status>> closes;
  {
    absl::MutexLock lock(owner_mu_);
    batch.swap(sends_);
    closes.swap(closes_);
    pending_.store(false, std::memory_order_release);
  }
  for (const auto& [sink, why] : closes) sink->Close(why);
  for (const PendingSend& p : batch) p.sink->SendTo(p.ranks, p.message);
}

}  // namespace dynmo::service
