#include "agent/host_batch.h"

#include <utility>

namespace dynmo::agent {

size_t FillHostBatch(absl::Span<const BatchSource> sources, size_t max,
                     dynmo::v1::HostBatch* batch, std::vector<size_t>* taken) {
  size_t n = 0;
  auto add = [&](size_t i) {
    auto* m = batch->add_messages();
    m->set_rank(sources[i].rank);
    if (taken != nullptr) taken->push_back(i);
    ++n;
    return m;
  };
  for (size_t i = 0; i < sources.size() && n < max; ++i) {
    auto& acks = sources[i].queues->acks;
    while (!acks.empty() && n < max) {
      *add(i)->mutable_ack() = std::move(acks.front());
      acks.pop_front();
    }
  }
  for (bool progress = true; progress && n < max;) {
    progress = false;
    for (size_t i = 0; i < sources.size() && n < max; ++i) {
      auto& reports = sources[i].queues->reports;
      if (reports.empty()) continue;
      *add(i)->mutable_report() = std::move(reports.front());
      reports.pop_front();
      progress = true;
    }
  }
  return n;
}

}  // namespace dynmo::agent
