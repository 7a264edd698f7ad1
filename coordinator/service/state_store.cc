#include "coordinator/service/state_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace dynmo::service {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const std::string& data, const std::string& p) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(absl::StrCat("write ", p));
    }
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& p, int flags) {
  int fd = ::open(p.c_str(), flags);
  if (fd < 0) return Errno(absl::StrCat("open ", p));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno(absl::StrCat("fsync ", p));
  return absl::OkStatus();
}

}  // namespace

absl::Status StateStore::Open() {
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    const int err = errno;
    struct stat st;
    // A read-only file system may say EROFS for a directory that exists.
    if (::stat(dir_.c_str(), &st) != 0) {
      errno = err;
      return Errno(absl::StrCat("mkdir ", dir_));
    }
  }
  struct stat st;
  if (::stat(dir_.c_str(), &st) != 0) return Errno(absl::StrCat("stat ", dir_));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state dir ", dir_, " is not a directory"));
  }
  if (lock_fd_ >= 0) return absl::OkStatus();
  absl::Status write = LockForWrite();
  if (write.ok()) return absl::OkStatus();
  if (write.code() == absl::StatusCode::kFailedPrecondition) return write;
  why_read_only_ = std::string(write.message());
  return LockForRead();
}

absl::Status StateStore::LockForWrite() {
  if (::access(dir_.c_str(), W_OK) != 0) {
    return Errno(absl::StrCat("state dir ", dir_, " not writable"));
  }
  const std::string lock_path = dir_ + "/LOCK";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(absl::StrCat("open ", lock_path));
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  if (::fcntl(fd, F_SETLK, &lock) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EACCES || err == EAGAIN) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state dir ", dir_, " is in use by another dynmo-coordinator (", lock_path,
          " is locked)"));
    }
    errno = err;
    return Errno(absl::StrCat("lock ", lock_path));
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);  // the read lock it replaces
  lock_fd_ = fd;
  write_locked_ = true;
  why_read_only_.clear();
  return absl::OkStatus();
}

absl::Status StateStore::LockForRead() {
  const std::string lock_path = dir_ + "/LOCK";
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::OkStatus();  // none to take: nobody can write here either
  struct flock lock = {};
  lock.l_type = F_RDLCK;
  lock.l_whence = SEEK_SET;
  if (::fcntl(fd, F_SETLK, &lock) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "state dir ", dir_, " is in use by another dynmo-coordinator (", lock_path,
        " is locked)"));
  }
  lock_fd_ = fd;
  return absl::OkStatus();
}

StateStore::~StateStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

absl::StatusOr<std::optional<dynmo::v1::CoordinatorState>> StateStore::Load()
    const {
  if (::access(path().c_str(), F_OK) != 0 && errno == ENOENT) {
    return std::nullopt;
  }
  std::ifstream in(path(), std::ios::binary);
  if (!in) return Errno(absl::StrCat("open ", path()));
  std::stringstream buf;
  buf << in.rdbuf();
  dynmo::v1::CoordinatorState state;
  if (!state.ParseFromString(buf.str())) {
    return absl::DataLossError(
        absl::StrCat(path(), " is not a CoordinatorState snapshot"));
  }
  return state;
}

absl::Status StateStore::Save(const dynmo::v1::CoordinatorState& state) {
  if (!write_locked_) {
    if (absl::Status s = LockForWrite(); !s.ok()) return s;
  }
  std::string data;
  if (!state.SerializeToString(&data)) {
    return absl::InternalError("cannot serialize the coordinator state");
  }
  const std::string tmp = path() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(absl::StrCat("open ", tmp));
  absl::Status s = WriteAll(fd, data, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno(absl::StrCat("fsync ", tmp));
  ::close(fd);
  if (s.ok() && ::rename(tmp.c_str(), path().c_str()) != 0) {
    s = Errno(absl::StrCat("rename ", tmp));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());  // no half-written temp file is left (ENOSPC)
    return s;
  }
  return FsyncPath(dir_, O_RDONLY | O_DIRECTORY);
}

StateKeeper::StateKeeper(std::string dir) : dir_(dir), store_(std::move(dir)) {}

absl::StatusOr<dynmo::v1::CoordinatorState> StateKeeper::Open() {
  dynmo::v1::CoordinatorState state;
  if (!durable()) return state;
  if (absl::Status s = store_.Open(); !s.ok()) return s;
  absl::StatusOr<std::optional<dynmo::v1::CoordinatorState>> loaded =
      store_.Load();
  if (!loaded.ok()) return loaded.status();
  if (loaded->has_value()) state = **loaded;
  const bool read_only = !store_.writable();
  {
    absl::MutexLock lock(&mu_);
    read_only_ = read_only;
    saved_ = state;
    generation_ = state.generation();
    next_gpu_id_ = state.next_gpu_id() > 0 ? state.next_gpu_id() : 1;
    for (const auto& job : state.jobs()) jobs_[job.name()] = job;
    pool_.assign(state.pool().begin(), state.pool().end());
  }
  if (read_only && on_mode_) {
    on_mode_(false, absl::UnavailableError(store_.why_read_only()));
  }
  return state;
}

absl::Status StateKeeper::CommitJob(const dynmo::v1::JobRecord& job) {
  absl::Status s;
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    const bool was = read_only_;
    jobs_[job.name()] = job;
    s = CommitLocked();
    changed = was != read_only_;
  }
  return Report(std::move(s), changed);
}

absl::Status StateKeeper::CommitPool(const std::vector<dynmo::v1::ReleasedGpu>& pool,
                                     uint64_t next_gpu_id) {
  absl::Status s;
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    const bool was = read_only_;
    pool_ = pool;
    next_gpu_id_ = next_gpu_id;
    s = CommitLocked();
    changed = was != read_only_;
  }
  return Report(std::move(s), changed);
}

absl::Status StateKeeper::RemoveJob(const std::string& name) {
  absl::Status s;
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    const bool was = read_only_;
    jobs_.erase(name);
    s = CommitLocked();
    changed = was != read_only_;
  }
  return Report(std::move(s), changed);
}

absl::Status StateKeeper::Probe() {
  absl::Status s;
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    if (!read_only_) return absl::OkStatus();
    s = CommitLocked();
    changed = !read_only_;
  }
  return Report(std::move(s), changed);
}

bool StateKeeper::read_only() const {
  absl::MutexLock lock(&mu_);
  return read_only_;
}

absl::Status StateKeeper::CommitLocked() {
  if (!durable()) {
    ++generation_;
    return absl::OkStatus();
  }
  dynmo::v1::CoordinatorState state;
  state.set_generation(generation_ + 1);
  state.set_next_gpu_id(next_gpu_id_);
  for (const auto& [name, job] : jobs_) *state.add_jobs() = job;
  for (const auto& gpu : pool_) *state.add_pool() = gpu;
  if (absl::Status s = store_.Save(state); !s.ok()) {
    ++failures_;
    jobs_.clear();
    for (const auto& job : saved_.jobs()) jobs_[job.name()] = job;
    pool_.assign(saved_.pool().begin(), saved_.pool().end());
    next_gpu_id_ = saved_.next_gpu_id() > 0 ? saved_.next_gpu_id() : 1;
    read_only_ = true;
    return absl::UnavailableError(absl::StrCat(
        "state not persisted (", s.message(),
        "); the coordinator is read-only until its state dir takes writes again"));
  }
  read_only_ = false;
  ++generation_;
  saved_ = std::move(state);
  return absl::OkStatus();
}

absl::Status StateKeeper::Report(absl::Status s, bool mode_changed) {
  if (!s.ok() && on_failure_) on_failure_(s);
  if (mode_changed && on_mode_) on_mode_(s.ok(), s);
  return s;
}

uint64_t StateKeeper::commits() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

uint64_t StateKeeper::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

}  // namespace dynmo::service
