#include "coordinator/job/job_effects.h"

#include <iterator>
#include <utility>

namespace dynmo::service {
namespace {

template <typename T>
void MoveAppend(std::vector<T>& from, std::vector<T>* to) {
  to->insert(to->end(), std::make_move_iterator(from.begin()),
             std::make_move_iterator(from.end()));
}

}  // namespace

void JobEffects::Append(JobEffects later) {
  MoveAppend(later.closes, &closes);
  MoveAppend(later.sends, &sends);
  MoveAppend(later.events, &events);
  MoveAppend(later.released, &released);
  MoveAppend(later.decision_latency_s, &decision_latency_s);
  MoveAppend(later.gains, &gains);
  reports += later.reports;
  plans_issued += later.plans_issued;
  plans_aborted += later.plans_aborted;
  plans_applied += later.plans_applied;
  migrated_bytes += later.migrated_bytes;
  measures_changed = measures_changed || later.measures_changed;
  speeds_changed = speeds_changed || later.speeds_changed;
}

}  // namespace dynmo::service
