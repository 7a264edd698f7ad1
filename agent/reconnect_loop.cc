#include "agent/reconnect_loop.h"

#include <algorithm>

namespace dynmo::agent {

void ReconnectLoop(absl::Mutex& mu, const bool* stop, absl::Duration initial,
                   absl::Duration max, const std::function<bool()>& serve_once) {
  absl::Duration backoff = initial;
  for (;;) {
    if (serve_once()) backoff = initial;
    absl::MutexLock lock(&mu);
    if (*stop) return;
    mu.AwaitWithTimeout(absl::Condition(stop), backoff);
    if (*stop) return;
    backoff = std::min(backoff * 2, max);
  }
}

}  // namespace dynmo::agent
