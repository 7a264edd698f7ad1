// How the queued messages of several ranks share one HostSession write: the
// rule of HostAgent (host_agent.h) and of the node relay's upstream
// (relay/upstream.h). RankQueues is what one rank has queued for the
// coordinator; FillHostBatch moves the next batch out of several of them.
//
// Thread-compatible: the owner's lock guards the queues.
#ifndef DYNMO_AGENT_HOST_BATCH_H_
#define DYNMO_AGENT_HOST_BATCH_H_

#include <cstddef>
#include <deque>
#include <vector>

#include "absl/types/span.h"
#include "dynmo/v1/agent.pb.h"

namespace dynmo::agent {

// One rank's messages waiting to go upstream, oldest first.
struct RankQueues {
  std::deque<dynmo::v1::PlanAck> acks;
  std::deque<dynmo::v1::IterationReport> reports;
};

// One rank's place in a batch: its id (HostRankMessage.rank) and queues.
struct BatchSource {
  int rank = -1;
  RankQueues* queues = nullptr;
};

// Moves at most `max` queued messages into `batch`: every ack first, rank by
// rank (a plan's verdict must not wait behind reports), then one report per
// rank round-robin (no rank starves another). Appends to `taken`, when
// given, the index into `sources` of each message added. Returns how many.
size_t FillHostBatch(absl::Span<const BatchSource> sources, size_t max,
                     dynmo::v1::HostBatch* batch,
                     std::vector<size_t>* taken = nullptr);

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_HOST_BATCH_H_
