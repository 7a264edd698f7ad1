#include "launcher/line_prefixer.h"

namespace dynmo::launcher {

std::string LinePrefixer::Append(absl::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    if (newline == absl::string_view::npos) {
      pending_.append(bytes.data(), bytes.size());
      break;
    }
    out.append(prefix_).append(pending_);
    out.append(bytes.data(), newline + 1);
    pending_.clear();
    bytes.remove_prefix(newline + 1);
  }
  // Bound the memory a rank that never prints a newline can pin.
  while (pending_.size() >= max_line_) {
    out.append(prefix_).append(pending_, 0, max_line_).append("\n");
    pending_.erase(0, max_line_);
  }
  return out;
}

std::string LinePrefixer::Finish() {
  if (pending_.empty()) return "";
  std::string out = prefix_ + pending_ + "\n";
  pending_.clear();
  return out;
}

}  // namespace dynmo::launcher
