#include "storage/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace dynmo::storage {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(absl::StrCat("write ", path));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

std::string FolderOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("open ", dir));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno(absl::StrCat("fsync ", dir));
  return absl::OkStatus();
}

absl::Status ReplaceFileDurably(const std::string& path, absl::string_view data,
                                const std::string& tmp_path) {
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(absl::StrCat("open ", tmp_path));
  absl::Status s = WriteAll(fd, data, tmp_path);
  if (s.ok() && ::fsync(fd) != 0) s = Errno(absl::StrCat("fsync ", tmp_path));
  ::close(fd);
  if (s.ok() && ::rename(tmp_path.c_str(), path.c_str()) != 0) {
    s = Errno(absl::StrCat("rename ", tmp_path, " to ", path));
  }
  if (!s.ok()) {
    ::unlink(tmp_path.c_str());  // no half-written temp file is left (ENOSPC)
    return s;
  }
  return FsyncDir(FolderOf(path));
}

absl::StatusOr<std::optional<std::string>> ReadWholeFile(const std::string& path) {
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return Errno(absl::StrCat("open ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Errno(absl::StrCat("read ", path));
  return buf.str();
}

}  // namespace dynmo::storage
