#include "trainer/state/checkpoint.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dynmo::trainer {
namespace {

// mkdir that tolerates the directory existing (other ranks race to create it).
absl::Status MakeDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("--save_dir: cannot create ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status SaveStageLayers(const std::string& dir, const std::vector<OwnedLayer>& layers) {
  const size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = MakeDirectory(dir.substr(0, slash)); !s.ok()) return s;
  }
  if (absl::Status s = MakeDirectory(dir); !s.ok()) return s;
  for (const OwnedLayer& owned : layers) {
    const std::string path = LayerStatePath(dir, owned.layer->id());
    if (absl::Status s = WriteLayerStateFile(CaptureLayerState(owned), path); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--save_dir: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OwnedLayer>> LoadStageLayers(const std::string& dir,
                                                        const TrainerConfig& config,
                                                        int first, int last) {
  std::vector<OwnedLayer> out;
  for (int id = first; id < last; ++id) {
    const std::string path = LayerStatePath(dir, id);
    absl::StatusOr<LayerState> state = ReadLayerStateFile(path);
    if (!state.ok()) {
      return absl::Status(state.status().code(),
                          absl::StrCat("--load_dir: ", state.status().message()));
    }
    if (state->id != id) {
      return absl::DataLossError(absl::StrCat("--load_dir: ", path, " holds layer ", state->id));
    }
    absl::StatusOr<OwnedLayer> owned = RestoreLayer(config, *state);
    if (!owned.ok()) {
      return absl::Status(owned.status().code(),
                          absl::StrCat("--load_dir: ", path, ": ", owned.status().message()));
    }
    out.push_back(*std::move(owned));
  }
  return out;
}

absl::Status SaveCheckpoint(Transport& transport, const std::string& dir,
                            const std::vector<OwnedLayer>& layers, bool write_layers,
                            const CheckpointManifest* manifest) {
  if (write_layers) {
    if (absl::Status s = SaveStageLayers(dir, layers); !s.ok()) return s;
  }
  if (absl::Status s = transport.Barrier(); !s.ok()) return s;
  if (manifest == nullptr) return absl::OkStatus();
  return WriteManifest(dir, *manifest);
}

}  // namespace dynmo::trainer
