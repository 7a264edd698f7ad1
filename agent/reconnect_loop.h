// ReconnectLoop: the background loop of RankLink (rank_link.h), the engine
// under Agent and HostAgent. It serves one session (register, then stream
// until the session ends) and waits before the next attempt: the initial
// backoff after a session that was established, doubling up to `max` after
// each one that was not, in a sleep that setting `*stop` (guarded by `mu`)
// interrupts. Returns once *stop.
// Call on the owner's background thread, without holding `mu`.
#ifndef DYNMO_AGENT_RECONNECT_LOOP_H_
#define DYNMO_AGENT_RECONNECT_LOOP_H_

#include <functional>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dynmo::agent {

// `serve_once` returns true when its session was established.
void ReconnectLoop(absl::Mutex& mu, const bool* stop, absl::Duration initial,
                   absl::Duration max, const std::function<bool()>& serve_once);

}  // namespace dynmo::agent

#endif  // DYNMO_AGENT_RECONNECT_LOOP_H_
