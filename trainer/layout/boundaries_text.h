// ParseBoundaries: "0,3,6" → core::Boundaries, as the flags and the
// test-policy targets write them. Syntax only: no validation against a
// model (core::ValidateBoundaries does that). Stateless; thread-safe.
#ifndef DYNMO_TRAINER_LAYOUT_BOUNDARIES_TEXT_H_
#define DYNMO_TRAINER_LAYOUT_BOUNDARIES_TEXT_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/boundaries.h"

namespace dynmo::trainer {

absl::StatusOr<core::Boundaries> ParseBoundaries(absl::string_view text);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_LAYOUT_BOUNDARIES_TEXT_H_
