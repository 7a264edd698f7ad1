// Durable files: the one way DynMo replaces a file so that a crash (kill -9,
// power loss) leaves its old or its new contents, never a torn one — write a
// temp file beside it, fsync it, rename it over the file, fsync the folder —
// and reads a whole file back. Used by the coordinator's state dir
// (coordinator/service/state_store.h) and the trainer's checkpoints
// (trainer/state/checkpoint_manifest.h, layer_state.h).
//
// Plain POSIX; thread-safe as far as the file system is (two writers of
// one path must use different temp paths).
#ifndef DYNMO_STORAGE_DURABLE_FILE_H_
#define DYNMO_STORAGE_DURABLE_FILE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dynmo::storage {

// Replaces `path` with `data` through `tmp_path` (beside it, same file
// system): write, fsync, rename, fsync of the folder. On an error no temp
// file is left and `path` is as it was; INTERNAL naming the step and errno.
absl::Status ReplaceFileDurably(const std::string& path, absl::string_view data,
                                const std::string& tmp_path);

// fsync of a folder: makes its entries (a rename, a new file) durable.
absl::Status FsyncDir(const std::string& dir);

// The whole file; nullopt when it does not exist; INTERNAL for another
// error.
absl::StatusOr<std::optional<std::string>> ReadWholeFile(const std::string& path);

}  // namespace dynmo::storage

#endif  // DYNMO_STORAGE_DURABLE_FILE_H_
