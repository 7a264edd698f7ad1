#include "coordinator/job/log_field.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace dynmo::service {

LogField::LogField(absl::string_view key, double value)
    : key_(key), bare_(std::isfinite(value)) {
  value_ = bare_ ? absl::StrFormat("%.6g", value) : absl::StrCat(value);
}

}  // namespace dynmo::service
