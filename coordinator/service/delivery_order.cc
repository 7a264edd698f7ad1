#include "coordinator/service/delivery_order.h"

#include <utility>

namespace dynmo::service {

Delivery::~Delivery() {
  if (turn_ == 0) return;  // no turn taken
  absl::MutexLock lock(&order_->mu_);
  while (order_->done_ + 1 != turn_) order_->turn_done_.Wait(&order_->mu_);
  for (const JobEffects::Close& c : closes_) c.sink->Close(c.why);
  for (const JobEffects::Send& s : sends_) s.sink->SendTo(s.ranks, s.message);
  order_->done_ = turn_;
  order_->turn_done_.SignalAll();
}

void Delivery::Take(JobEffects& effects) {
  if (effects.closes.empty() && effects.sends.empty()) return;
  for (JobEffects::Close& c : effects.closes) {
    // A multiplexed session may be replaced for several ranks at once.
    bool seen = false;
    for (const JobEffects::Close& k : closes_) seen = seen || k.sink == c.sink;
    if (!seen) closes_.push_back(std::move(c));
  }
  for (JobEffects::Send& s : effects.sends) sends_.push_back(std::move(s));
  if (turn_ == 0) turn_ = ++order_->taken_;
}

}  // namespace dynmo::service
