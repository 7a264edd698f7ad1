#include "trainer/state/checkpoint_manifest.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "storage/durable_file.h"

namespace dynmo::trainer {
namespace {

constexpr char kFormat[] = "dynmo-checkpoint-1";

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

CheckpointManifest ManifestFor(const TrainerConfig& c, int64_t iteration,
                               const core::Boundaries& b) {
  CheckpointManifest m;
  m.iteration = iteration;
  m.num_layers = c.model.num_pipeline_layers();
  m.num_blocks = c.model.num_blocks;
  m.hidden = c.model.hidden;
  m.heads = c.model.heads;
  m.seq_len = c.model.seq_len;
  m.vocab = c.model.vocab;
  m.dynamism = c.model.dynamism.cases;
  m.seed = c.seed;
  m.data = c.data;
  m.global_batch_samples = static_cast<int64_t>(c.dp) * c.microbatches * c.micro_batch;
  m.samples_consumed = iteration * m.global_batch_samples;
  m.saved_pp = c.pp;
  m.saved_dp = c.dp;
  m.saved_boundaries = b;
  return m;
}

std::string ManifestToJson(const CheckpointManifest& m) {
  nlohmann::json j;
  j["format"] = kFormat;
  j["iteration"] = m.iteration;
  j["num_layers"] = m.num_layers;
  j["model"] = {{"layers", m.num_blocks}, {"hidden", m.hidden}, {"heads", m.heads},
                {"seq_len", m.seq_len},   {"vocab", m.vocab},   {"dynamism", m.dynamism}};
  j["seed"] = m.seed;
  j["data"] = m.data;
  j["global_batch_samples"] = m.global_batch_samples;
  j["samples_consumed"] = m.samples_consumed;
  j["saved_at"] = {{"pp", m.saved_pp}, {"dp", m.saved_dp}, {"boundaries", m.saved_boundaries}};
  return j.dump(2) + "\n";
}

absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("manifest is not a JSON object");
  }
  CheckpointManifest m;
  try {
    if (j.at("format").get<std::string>() != kFormat) {
      return absl::InvalidArgumentError(absl::StrCat(
          "manifest format ", j.at("format").dump(), " is not ", kFormat));
    }
    m.iteration = j.at("iteration").get<int64_t>();
    m.num_layers = j.at("num_layers").get<int>();
    const nlohmann::json& model = j.at("model");
    m.num_blocks = model.at("layers").get<int>();
    m.hidden = model.at("hidden").get<int>();
    m.heads = model.at("heads").get<int>();
    m.seq_len = model.at("seq_len").get<int>();
    m.vocab = model.at("vocab").get<int>();
    m.dynamism = model.at("dynamism").get<std::vector<std::string>>();
    m.seed = j.at("seed").get<uint64_t>();
    m.data = j.at("data").get<std::string>();
    m.global_batch_samples = j.at("global_batch_samples").get<int64_t>();
    m.samples_consumed = j.at("samples_consumed").get<int64_t>();
    m.saved_pp = j.at("saved_at").at("pp").get<int>();
    m.saved_dp = j.at("saved_at").at("dp").get<int>();
    m.saved_boundaries = j.at("saved_at").at("boundaries").get<std::vector<int>>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed manifest: ", e.what()));
  }
  if (m.iteration < 0 || m.num_layers < 1) {
    return absl::InvalidArgumentError("manifest has a negative iteration or no layers");
  }
  return m;
}

absl::Status CheckResumable(const CheckpointManifest& m, const TrainerConfig& c) {
  const CheckpointManifest want = ManifestFor(c, m.iteration, {});
  std::vector<std::string> diffs;
  auto compare = [&](const char* flag, auto saved, auto now) {
    if (saved != now) diffs.push_back(absl::StrCat("--", flag, "=", saved, " (this job: ", now, ")"));
  };
  compare("layers", m.num_blocks, want.num_blocks);
  compare("hidden", m.hidden, want.hidden);
  compare("heads", m.heads, want.heads);
  compare("seq_len", m.seq_len, want.seq_len);
  compare("vocab", m.vocab, want.vocab);
  compare("dynamism", absl::StrJoin(m.dynamism, ","), absl::StrJoin(want.dynamism, ","));
  if (!diffs.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint is of a different model: ", absl::StrJoin(diffs, ", ")));
  }
  if (m.num_layers != want.num_layers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint has ", m.num_layers, " pipeline layers, this job ", want.num_layers));
  }
  if (m.global_batch_samples != want.global_batch_samples) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint was taken with a global batch of ", m.global_batch_samples,
        " samples (dp x microbatches x micro_batch); this job's is ",
        want.global_batch_samples, ", so the data stream would not continue"));
  }
  if (m.iteration >= c.steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint is at iteration ", m.iteration, ": nothing left of --steps=", c.steps));
  }
  return absl::OkStatus();
}

std::string CheckpointDir(const std::string& root, int64_t iteration) {
  return absl::StrCat(root, "/iter_", iteration);
}

std::string LayerStatePath(const std::string& dir, int id) {
  return absl::StrCat(dir, "/layer_", id, ".state");
}

std::string ManifestPath(const std::string& dir) { return dir + "/manifest.json"; }

absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& manifest) {
  const std::string path = ManifestPath(dir);
  // Durable: a crash leaves the old manifest or the new, never half of one.
  absl::Status s = storage::ReplaceFileDurably(path, ManifestToJson(manifest),
                                               absl::StrCat(path, ".tmp.", getpid()));
  if (!s.ok()) return absl::InternalError(absl::StrCat("--save_dir: ", s.message()));
  return absl::OkStatus();
}

absl::StatusOr<FoundCheckpoint> FindLatestCheckpoint(const std::string& root) {
  if (!IsDirectory(root)) {
    return absl::NotFoundError(absl::StrCat("--load_dir=", root, ": no such directory"));
  }
  DIR* d = opendir(root.c_str());
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat("--load_dir=", root, ": cannot list it"));
  }
  std::optional<FoundCheckpoint> best;
  std::string last_error;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    int64_t k = 0;
    if (!absl::StartsWith(name, "iter_") || !absl::SimpleAtoi(name.substr(5), &k) || k < 0) {
      continue;
    }
    if (best && best->manifest.iteration >= k) continue;
    const std::string dir = CheckpointDir(root, k);
    std::ifstream in(ManifestPath(dir));
    if (!in) continue;  // incomplete: a save that did not finish
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<CheckpointManifest> m = ParseManifest(text.str());
    if (!m.ok()) {
      last_error = absl::StrCat(ManifestPath(dir), ": ", m.status().message());
      continue;
    }
    if (m->iteration != k) {
      last_error = absl::StrCat(ManifestPath(dir), ": says iteration ", m->iteration);
      continue;
    }
    best = FoundCheckpoint{dir, *std::move(m)};
  }
  closedir(d);
  if (!best) {
    return absl::NotFoundError(absl::StrCat(
        "--load_dir=", root, " holds no complete checkpoint (iter_<k>/manifest.json)",
        last_error.empty() ? "" : absl::StrCat("; ", last_error)));
  }
  return *std::move(best);
}

}  // namespace dynmo::trainer
