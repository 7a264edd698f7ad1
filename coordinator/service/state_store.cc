#include "coordinator/service/state_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/job/validation.h"
#include "coordinator/service/record_file.h"
#include "storage/durable_file.h"

namespace dynmo::service {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

using storage::FsyncDir;
using storage::ReadWholeFile;

// Replaces a record file durably through <path>.tmp (storage/durable_file.h).
absl::Status ReplaceFile(const std::string& path, const std::string& data) {
  return storage::ReplaceFileDurably(path, data, path + ".tmp");
}

// A record file read back, its checksum checked (record_file.h) and parsed
// into `record`: false when there is no file; the read's own error when it
// cannot be read; DATA_LOSS naming `path` when it fails its checksum or
// does not parse as `what`.
absl::StatusOr<bool> ReadRecordFile(const std::string& path, const char* what,
                                    google::protobuf::Message* record) {
  absl::StatusOr<std::optional<std::string>> data = ReadWholeFile(path);
  if (!data.ok()) return data.status();
  if (!data->has_value()) return false;
  absl::StatusOr<std::string> bytes = UnframedRecord(std::move(**data), path);
  if (!bytes.ok()) return bytes.status();
  if (!record->ParseFromString(*bytes)) {
    return absl::DataLossError(absl::StrCat(path, " is not ", what));
  }
  return true;
}

// The job names of the record files in `jobs_dir` (<name>.pb; temp files of
// writes a crash interrupted are not records), sorted; nullopt when there
// is no such folder.
absl::StatusOr<std::optional<std::vector<std::string>>> ListJobFiles(
    const std::string& jobs_dir) {
  DIR* d = ::opendir(jobs_dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return std::nullopt;
    return Errno(absl::StrCat("open ", jobs_dir));
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string file = e->d_name;
    if (file.size() > 3 && absl::EndsWith(file, ".pb")) {
      names.push_back(file.substr(0, file.size() - 3));
    }
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status CheckJobName(const std::string& name) {
  if (absl::Status s = ValidateJobName(name); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no state file for this job: ", s.message()));
  }
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
  dir_id_ = {st.st_dev, st.st_ino};
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

absl::StatusOr<std::optional<dynmo::v1::CoordinatorState>> StateStore::Load() {
  legacy_ = false;
  bad_records_.clear();
  absl::StatusOr<std::optional<std::string>> old = ReadWholeFile(legacy_path());
  if (!old.ok()) return old.status();
  dynmo::v1::CoordinatorState state;
  if (old->has_value()) {
    if (!state.ParseFromString(**old)) {
      return absl::DataLossError(
          absl::StrCat(legacy_path(), " is not a CoordinatorState snapshot"));
    }
    legacy_ = true;
    return state;
  }
  absl::StatusOr<bool> pool = ReadRecordFile(pool_path(), "a pool record", &state);
  if (!pool.ok()) return pool.status();
  const bool any = *pool;
  state.clear_jobs();
  absl::StatusOr<std::optional<std::vector<std::string>>> names = ListJobFiles(jobs_dir());
  if (!names.ok()) return names.status();
  if (!any && !names->has_value()) return std::nullopt;
  for (const std::string& name : names->value_or(std::vector<std::string>{})) {
    absl::StatusOr<dynmo::v1::JobRecord> job = LoadJob(name);
    if (job.ok()) {
      *state.add_jobs() = *std::move(job);
    } else if (job.status().code() != absl::StatusCode::kNotFound) {
      // One job's bad file is that job's problem, not every job's.
      bad_records_.push_back(BadRecord{name, job_path(name), job.status()});
    }
  }
  return state;
}

absl::StatusOr<dynmo::v1::JobRecord> StateStore::LoadJob(const std::string& name) const {
  const std::string path = job_path(name);
  dynmo::v1::JobRecord job;
  const std::string what = absl::StrCat("the job record of '", name, "'");
  absl::StatusOr<bool> read = ReadRecordFile(path, what.c_str(), &job);
  if (!read.ok()) return absl::DataLossError(read.status().message());
  if (!*read) return absl::NotFoundError(absl::StrCat(path, " was removed"));
  if (job.name() != name) {
    return absl::DataLossError(absl::StrCat(path, " is not the job record of '", name, "'"));
  }
  return job;
}

absl::Status StateStore::SetAsideJob(const std::string& name) {
  if (absl::Status s = CheckJobName(name); !s.ok()) return s;
  if (absl::Status s = ReadyToWrite(); !s.ok()) return s;
  const std::string path = job_path(name);
  const std::string aside = path + ".quarantined";
  if (::rename(path.c_str(), aside.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno(absl::StrCat("rename ", path, " to ", aside));
  }
  return FsyncDir(jobs_dir());
}

absl::Status StateStore::ReadyToWrite() {
  // The lock is the directory's that Open found: a directory put in its
  // place since (a swap, a restore under a running daemon) is not ours to
  // write, and may be another coordinator's.
  struct stat st;
  if (dir_id_ && (::stat(dir_.c_str(), &st) != 0 ||
                  std::make_pair(st.st_dev, st.st_ino) != *dir_id_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state dir ", dir_, " was replaced or removed while this coordinator ran: it is not "
        "the directory this coordinator locked, so nothing is written into it (restart the "
        "coordinator to use it)"));
  }
  if (!write_locked_) {
    if (absl::Status s = LockForWrite(); !s.ok()) return s;
  }
  if (::mkdir(jobs_dir().c_str(), 0755) == 0) return FsyncDir(dir_);
  if (errno != EEXIST) return Errno(absl::StrCat("mkdir ", jobs_dir()));
  return absl::OkStatus();
}

absl::Status StateStore::SaveJob(const dynmo::v1::JobRecord& job) {
  if (absl::Status s = CheckJobName(job.name()); !s.ok()) return s;
  if (absl::Status s = ReadyToWrite(); !s.ok()) return s;
  std::string data;
  if (!job.SerializeToString(&data)) {
    return absl::InternalError(absl::StrCat("cannot serialize job ", job.name()));
  }
  return ReplaceFile(job_path(job.name()), FramedRecord(data));
}

absl::Status StateStore::RemoveJob(const std::string& name) {
  if (absl::Status s = CheckJobName(name); !s.ok()) return s;
  if (absl::Status s = ReadyToWrite(); !s.ok()) return s;
  const std::string path = job_path(name);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno(absl::StrCat("unlink ", path));
  }
  return FsyncDir(jobs_dir());
}

absl::Status StateStore::SavePool(uint64_t generation, uint64_t next_gpu_id,
                                  const std::vector<dynmo::v1::ReleasedGpu>& pool) {
  if (absl::Status s = ReadyToWrite(); !s.ok()) return s;
  dynmo::v1::CoordinatorState record;
  record.set_generation(generation);
  record.set_next_gpu_id(next_gpu_id);
  for (const auto& gpu : pool) *record.add_pool() = gpu;
  std::string data;
  if (!record.SerializeToString(&data)) {
    return absl::InternalError("cannot serialize the released-GPU pool");
  }
  return ReplaceFile(pool_path(), FramedRecord(data));
}

absl::Status StateStore::Save(const dynmo::v1::CoordinatorState& state) {
  if (absl::Status s = ReadyToWrite(); !s.ok()) return s;
  std::vector<std::string> keep;
  for (const auto& job : state.jobs()) {
    if (absl::Status s = SaveJob(job); !s.ok()) return s;
    keep.push_back(job.name());
  }
  const std::vector<dynmo::v1::ReleasedGpu> pool(state.pool().begin(), state.pool().end());
  if (absl::Status s = SavePool(state.generation(), state.next_gpu_id(), pool); !s.ok()) {
    return s;
  }
  // Files of jobs the state lacks (deleted while the old snapshot ruled).
  absl::StatusOr<std::optional<std::vector<std::string>>> names = ListJobFiles(jobs_dir());
  if (!names.ok()) return names.status();
  for (const std::string& name : names->value_or(std::vector<std::string>{})) {
    if (std::find(keep.begin(), keep.end(), name) != keep.end()) continue;
    if (absl::Status s = RemoveJob(name); !s.ok()) return s;
  }
  if (::unlink(legacy_path().c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno(absl::StrCat("unlink ", legacy_path()));
  }
  legacy_ = false;
  return FsyncDir(dir_);
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
  bool read_only = !store_.writable();
  absl::Status why = absl::UnavailableError(store_.why_read_only());
  {
    absl::MutexLock lock(&mu_);
    generation_ = state.generation();
    next_gpu_id_ = state.next_gpu_id() > 0 ? state.next_gpu_id() : 1;
    for (const auto& job : state.jobs()) jobs_[job.name()] = job;
    pool_.assign(state.pool().begin(), state.pool().end());
    migrate_ = store_.legacy();
    if (!read_only && migrate_) {
      // An older coordinator's snapshot becomes one file per record now;
      // where that fails the keeper is read-only until it works.
      if (absl::Status s = MigrateLocked(); !s.ok()) {
        read_only = true;
        why = absl::UnavailableError(absl::StrCat(
            "cannot migrate ", store_.legacy_path(), " to record files: ", s.message()));
      }
    }
    read_only_ = read_only;
  }
  if (read_only && on_mode_) on_mode_(false, why);
  return state;
}

absl::Status StateKeeper::Commit(const std::function<absl::Status()>& write,
                                  const std::function<void()>& staged) {
  absl::Status s;
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    const bool was = read_only_;
    s = MigrateLocked();
    if (s.ok() && durable()) s = write();
    s = Written(std::move(s));
    if (s.ok()) staged();
    changed = was != read_only_;
  }
  return Report(std::move(s), changed);
}

absl::Status StateKeeper::CommitJob(const dynmo::v1::JobRecord& job) {
  return Commit([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return store_.SaveJob(job); },
                [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { jobs_[job.name()] = job; });
}

absl::Status StateKeeper::CommitPool(const std::vector<dynmo::v1::ReleasedGpu>& pool,
                                     uint64_t next_gpu_id) {
  return Commit(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return store_.SavePool(generation_ + 1, next_gpu_id, pool);
      },
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        pool_ = pool;
        next_gpu_id_ = next_gpu_id;
      });
}

absl::Status StateKeeper::RemoveJob(const std::string& name) {
  return Commit([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return store_.RemoveJob(name); },
                [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { jobs_.erase(name); });
}

absl::Status StateKeeper::SetAsideJob(const std::string& name) {
  return Commit([&]() { return store_.SetAsideJob(name); }, [] {});
}

std::vector<StateStore::BadRecord> StateKeeper::bad_records() const {
  absl::MutexLock lock(&mu_);
  return store_.bad_records();
}

absl::Status StateKeeper::Probe() {
  absl::Status s;
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    if (!read_only_) return absl::OkStatus();
    // The smallest write that proves the disk takes writes again (or the
    // migration an old snapshot still waits for).
    s = MigrateLocked();
    if (s.ok()) s = store_.SavePool(generation_ + 1, next_gpu_id_, pool_);
    s = Written(std::move(s));
    changed = !read_only_;
  }
  return Report(std::move(s), changed);
}

bool StateKeeper::read_only() const {
  absl::MutexLock lock(&mu_);
  return read_only_;
}

absl::Status StateKeeper::MigrateLocked() {
  if (!migrate_ || !durable()) return absl::OkStatus();
  // The last good state: a commit migrates before it stages its change, so
  // a change whose own write fails is never on disk (until the migration's
  // last step removes it, the old snapshot rules whatever was written).
  dynmo::v1::CoordinatorState state;
  state.set_generation(generation_ + 1);
  state.set_next_gpu_id(next_gpu_id_);
  for (const auto& [name, job] : jobs_) *state.add_jobs() = job;
  for (const auto& gpu : pool_) *state.add_pool() = gpu;
  if (absl::Status s = store_.Save(state); !s.ok()) return s;
  migrate_ = false;
  return absl::OkStatus();
}

absl::Status StateKeeper::Written(absl::Status s) {
  if (!durable()) {
    ++generation_;
    return absl::OkStatus();
  }
  if (!s.ok()) return Refused(s);
  read_only_ = false;
  ++generation_;
  return absl::OkStatus();
}

absl::Status StateKeeper::Refused(const absl::Status& s) {
  ++failures_;
  read_only_ = true;
  return absl::UnavailableError(absl::StrCat(
      "state not persisted (", s.message(),
      "); the coordinator is read-only until its state dir takes writes again"));
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
