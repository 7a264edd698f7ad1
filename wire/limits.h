// The sanity bounds on what a rank sends: an iteration count, seconds per
// micro-batch for one layer, bytes or parameters of one layer or stage, an
// epoch. Larger values are garbage (or hostile) and would overflow sums.
// The report reader (report_codec.h) refuses them; the coordinator's other
// validators (coordinator/job/validation.h) use the same bounds.
#ifndef DYNMO_WIRE_LIMITS_H_
#define DYNMO_WIRE_LIMITS_H_

#include <cstdint>

namespace dynmo::wire {

inline constexpr int64_t kMaxIteration = int64_t{1} << 53;
inline constexpr double kMaxLayerSeconds = 86400;
inline constexpr int64_t kMaxBytes = int64_t{1} << 50;  // 1 PiB
inline constexpr uint64_t kMaxEpoch = uint64_t{1} << 53;

}  // namespace dynmo::wire

#endif  // DYNMO_WIRE_LIMITS_H_
