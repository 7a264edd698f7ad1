// The manifest of a per-layer checkpoint (checkpoint.h): what a resuming job
// needs to know before it loads any layer, and the mark that a checkpoint is
// complete. Rank 0 writes it last, atomically (temporary file + rename),
// after every stage wrote its layers and the job passed a barrier, so
//
//   DIR/iter_<k>/manifest.json   exists  <=>  iter_<k> holds every layer.
//
// Format (one JSON object):
//   {"format":"dynmo-checkpoint-1","iteration":k,   // iterations done = next to run
//    "num_layers":N,"model":{"layers":..,"hidden":..,"heads":..,"seq_len":..,
//    "vocab":..,"dynamism":[..]},"seed":..,"data":"..",
//    "global_batch_samples":dp*M*B,"samples_consumed":k*dp*M*B,
//    "saved_at":{"pp":..,"dp":..,"boundaries":[..]}}
// The data position is the iteration: sample windows are addressed by
// (iteration, replica, micro-batch, row) (token_corpus.h), so a job with the
// same global batch continues the stream exactly, at any pp and dp.
// No LibTorch; thread-compatible.
#ifndef DYNMO_TRAINER_STATE_CHECKPOINT_MANIFEST_H_
#define DYNMO_TRAINER_STATE_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/boundaries.h"
#include "trainer/config/config.h"

namespace dynmo::trainer {

struct CheckpointManifest {
  int64_t iteration = 0;
  int num_layers = 0;
  int num_blocks = 0;
  int hidden = 0;
  int heads = 0;
  int seq_len = 0;
  int vocab = 0;
  std::vector<std::string> dynamism;
  uint64_t seed = 0;
  std::string data;
  int64_t global_batch_samples = 0;
  int64_t samples_consumed = 0;
  int saved_pp = 0;
  int saved_dp = 0;
  core::Boundaries saved_boundaries;
};

// The manifest of `config`'s job after `iteration` iterations under `b`.
CheckpointManifest ManifestFor(const TrainerConfig& config, int64_t iteration,
                               const core::Boundaries& b);

std::string ManifestToJson(const CheckpointManifest& manifest);
// Errors (INVALID_ARGUMENT): not JSON, wrong format tag, missing fields.
absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view text);

// OK when a job of `config` can resume from `manifest`: the same model
// (layers, hidden, heads, seq_len, vocab, dynamism), the same global batch
// (dp * microbatches * micro_batch, so the data stream continues), and
// iterations left to run. Errors (FAILED_PRECONDITION) say what differs.
absl::Status CheckResumable(const CheckpointManifest& manifest,
                            const TrainerConfig& config);

// root/iter_<k>, root/iter_<k>/layer_<id>.state, root/iter_<k>/manifest.json.
std::string CheckpointDir(const std::string& root, int64_t iteration);
std::string LayerStatePath(const std::string& dir, int id);
std::string ManifestPath(const std::string& dir);

// Writes `manifest` to ManifestPath(dir) atomically.
absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& manifest);

struct FoundCheckpoint {
  std::string dir;  // root/iter_<k>
  CheckpointManifest manifest;
};

// The newest complete checkpoint under `root` (highest k whose manifest
// exists and parses). Errors: root missing or not a directory (NOT_FOUND),
// no complete checkpoint in it (NOT_FOUND); messages name --load_dir.
absl::StatusOr<FoundCheckpoint> FindLatestCheckpoint(const std::string& root);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STATE_CHECKPOINT_MANIFEST_H_
