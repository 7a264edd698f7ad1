#include "coordinator/job/constant_time.h"

#include <cstddef>

namespace dynmo::service {

bool ConstantTimeEquals(absl::string_view got, absl::string_view want) {
  unsigned char diff = got.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    const unsigned char g = i < got.size() ? got[i] : 0;
    diff |= static_cast<unsigned char>(g ^ want[i]);
  }
  return diff == 0;
}

}  // namespace dynmo::service
