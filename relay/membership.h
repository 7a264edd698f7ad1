// Membership: the ranks a node relay serves, with no I/O. It knows which
// ranks registered through the relay (with the session key their newest
// Register issued), which hold a session through it now (the session's
// outbox), what each has queued for the coordinator and how far each got.
// Its rules:
//
//   - A session's first message is its hello: the relay's job, a rank that
//     registered through the relay, the key of its newest Register. The
//     hello binds the session to the rank, replacing an older one.
//   - A newer Register of a rank makes the session it held stale.
//   - A rank's reports are queued (bounded, the oldest dropped), its acks
//     always; a batch takes acks first (agent/host_batch.h).
//   - Binding, leaving and a stale session change the set of ranks the
//     upstream session should carry (changed()); Settle() takes the new set.
//   - When the upstream session is lost, Clear() forgets every rank.
//
// It never ends a session itself: what must end is returned, for the caller
// to finish outside its lock. Not thread-safe: the relay serialises every
// call with its lock.
#ifndef DYNMO_RELAY_MEMBERSHIP_H_
#define DYNMO_RELAY_MEMBERSHIP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "agent/host_batch.h"
#include "dynmo/v1/agent.pb.h"
#include "relay/relay_config.h"
#include "rpc/stream_outbox.h"

namespace dynmo::relay {

// The write side of one rank's session through the relay.
using RankOutbox =
    rpc::StreamOutbox<dynmo::v1::AgentMessage, dynmo::v1::CoordinatorMessage>;

class Membership {
 public:
  Membership(std::string job, size_t report_queue_capacity);

  // A rank's Register went through and issued `session_key`. Returns the
  // rank's session that the new key made stale (its agent gave it up), or
  // null.
  std::shared_ptr<RankOutbox> Registered(int rank, std::string session_key);

  // One message on the session `out`, whose rank is *rank (-1 until the
  // hello binds it; then set). A hello that replaces an older session of the
  // rank returns it in *replaced. An error ends the session.
  absl::Status Receive(int* rank, const std::shared_ptr<RankOutbox>& out,
                       const dynmo::v1::AgentMessage& message,
                       std::shared_ptr<RankOutbox>* replaced);

  // The session `out` of `rank` ended.
  void Leave(int rank, const RankOutbox* out);

  // Ranks attached or left since the last Settle() (or Clear()), the last
  // time at changed_at().
  bool changed() const { return changed_; }
  absl::Time changed_at() const { return changed_at_; }
  // Every rank that left has no ack still waiting to go upstream.
  bool LeaversDrained() const;
  // Forgets the ranks that left; returns the attached ones, sorted, with
  // their session keys (the next upstream hello).
  void Settle(std::vector<int>* ranks, std::vector<std::string>* keys);
  // Forgets every rank (the upstream session is lost: all register again);
  // returns their sessions, to end.
  std::vector<std::shared_ptr<RankOutbox>> Clear();

  // The sessions of those of `ranks` attached (a plan message's addressees).
  std::vector<std::shared_ptr<RankOutbox>> SessionsOf(
      const google::protobuf::RepeatedField<int32_t>& ranks) const;
  // Moves at most `max` queued messages of `ranks` into `batch` (acks
  // first: FillHostBatch). Returns how many.
  size_t FillBatch(const std::vector<int>& ranks, size_t max,
                   dynmo::v1::HostBatch* batch);

  // Every rank that reported through the relay, by rank.
  std::vector<RankProgress> Progress() const;
  // Fills the rank-side fields of `stats`.
  void FillStats(NodeRelayStats* stats) const;

 private:
  // A rank's session and its messages waiting to go upstream.
  struct Member {
    std::shared_ptr<RankOutbox> out;  // null once the rank's session ended
    std::string session_key;          // the rank's, from its hello
    agent::RankQueues queues;
  };

  absl::Status Bind(int* rank, const std::shared_ptr<RankOutbox>& out,
                    const dynmo::v1::SessionHello& hello,
                    std::shared_ptr<RankOutbox>* replaced);
  void MarkChanged();

  const std::string job_;
  const size_t report_queue_capacity_;
  // Ranks registered through us since the last Clear(), with their keys.
  absl::flat_hash_map<int, std::string> registered_;
  absl::flat_hash_map<int, Member> members_;
  // Kept across sessions and Clear(): progress is the rank's.
  absl::flat_hash_map<int, RankProgress> progress_;
  bool changed_ = false;
  absl::Time changed_at_;
  int64_t rank_sessions_ = 0;
  int64_t rank_sessions_ended_ = 0;
  int64_t stale_sessions_ = 0;
  int64_t reports_dropped_ = 0;
};

}  // namespace dynmo::relay

#endif  // DYNMO_RELAY_MEMBERSHIP_H_
