#include "coordinator/job/proto_convert.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace dynmo::service {

absl::StatusOr<Policy> PolicyFromProto(const dynmo::v1::Policy& proto,
                                       const Policy& base) {
  Policy p = base;
  if (!proto.balancer().empty()) {
    absl::StatusOr<core::PartitionMethod> m =
        core::ParsePartitionMethod(proto.balancer());
    if (!m.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("balancer: ", m.status().message()));
    }
    p.balancer = *m;
  }
  if (!proto.trigger().empty()) {
    absl::StatusOr<Trigger> t = ParseTrigger(proto.trigger());
    if (!t.ok()) return t.status();
    p.trigger = *t;
  }
  if (!core::FiniteNonNegative(proto.repack_tolerance()) ||
      proto.repack_tolerance() > 10) {
    return absl::InvalidArgumentError(
        "repack_tolerance must be finite and in [0, 10]");
  }
  p.repack = proto.repack();
  p.repack_tolerance = proto.repack_tolerance();
  if (!proto.elastic().empty()) {
    absl::StatusOr<Elastic> e = ParseElastic(proto.elastic());
    if (!e.ok()) return e.status();
    p.elastic = *e;
  }
  return p;
}

dynmo::v1::Policy PolicyToProto(const Policy& policy) {
  dynmo::v1::Policy p;
  p.set_balancer(core::PartitionMethodName(policy.balancer));
  p.set_trigger(TriggerName(policy.trigger));
  p.set_repack(policy.repack);
  p.set_repack_tolerance(policy.repack_tolerance);
  p.set_elastic(ElasticName(policy.elastic));
  return p;
}

}  // namespace dynmo::service
