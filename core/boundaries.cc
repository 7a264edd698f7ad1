#include "core/boundaries.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dynmo::core {

absl::Status ValidateBoundaries(absl::Span<const int> b, int num_layers,
                                int num_stages) {
  if (static_cast<int>(b.size()) != num_stages + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundaries [", absl::StrJoin(b, ","), "] have ",
                     b.size(), " entries; ", num_stages, " stages need ",
                     num_stages + 1));
  }
  if (b.front() != 0 || b.back() != num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("boundaries [", absl::StrJoin(b, ","),
                     "] must start at 0 and end at ", num_layers));
  }
  for (int s = 0; s < num_stages; ++s) {
    if (b[s + 1] <= b[s]) {
      return absl::InvalidArgumentError(
          absl::StrCat("boundaries [", absl::StrJoin(b, ","), "] leave stage ",
                       s, " empty; they must strictly increase"));
    }
  }
  return absl::OkStatus();
}

int StageOfLayer(absl::Span<const int> b, int layer) {
  // First boundary strictly greater than `layer`, minus one.
  auto it = std::upper_bound(b.begin(), b.end(), layer);
  return static_cast<int>(it - b.begin()) - 1;
}

}  // namespace dynmo::core
