// Helpers shared by the end-to-end dynamic-model suites: the paper's
// imbalance of one JSON log record and its mean over a range of records.
// Header-only; include after train_job.h.
#ifndef DYNMO_TESTS_TRAINER_DYNAMISM_TEST_UTIL_H_
#define DYNMO_TESTS_TRAINER_DYNAMISM_TEST_UTIL_H_

#include <algorithm>
#include <vector>

#include "nlohmann/json.hpp"

namespace dynmo::trainer {
namespace {

// (max - min) / mean of the record's per-stage compute times.
double Imbalance(const nlohmann::json& record) {
  const std::vector<double> t = record["stage_times"].get<std::vector<double>>();
  double sum = 0, lo = t[0], hi = t[0];
  for (double v : t) {
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return sum > 0 ? (hi - lo) / (sum / t.size()) : 0;
}

// Mean imbalance of records [from, to).
double MeanImbalance(const std::vector<nlohmann::json>& records, size_t from, size_t to) {
  double sum = 0;
  for (size_t i = from; i < to; ++i) sum += Imbalance(records[i]);
  return to > from ? sum / (to - from) : 0;
}

// Index of the first record whose epoch is above 0 (records.size(): none).
size_t FirstRebalanced(const std::vector<nlohmann::json>& records) {
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i]["epoch"].get<int64_t>() > 0) return i;
  }
  return records.size();
}

}  // namespace
}  // namespace dynmo::trainer

#endif  // DYNMO_TESTS_TRAINER_DYNAMISM_TEST_UTIL_H_
