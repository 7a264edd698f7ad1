#include "trainer/layout/boundaries_text.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dynmo::trainer {

absl::StatusOr<core::Boundaries> ParseBoundaries(absl::string_view text) {
  core::Boundaries b;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "boundaries must be comma-separated integers, got '", text, "'"));
    }
    b.push_back(v);
  }
  return b;
}

}  // namespace dynmo::trainer
