// RunInPrivateTmpfs: runs a scenario in a forked child that has its own
// mount namespace (and a user namespace mapping it to root when the test is
// not root) with a small tmpfs on a fresh directory, so a test can fill the
// disk or make it read-only without touching the machine's. Shared by
// state_dir_full_test.cc and state_dir_read_only_test.cc.
#ifndef DYNMO_TESTS_SERVICE_PRIVATE_TMPFS_H_
#define DYNMO_TESTS_SERVICE_PRIVATE_TMPFS_H_

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"

namespace dynmo::service {

inline bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  return static_cast<bool>(out.flush());
}

// Enters a private mount namespace (and a user namespace mapping us to root
// when we are not root) and mounts a tmpfs of `size` on `dir`. Empty on
// success, else why not. Only in a single-threaded child.
inline std::string MountPrivateTmpfs(const std::string& dir, const char* size) {
  const uid_t uid = getuid();
  const gid_t gid = getgid();
  if (uid != 0) {
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      return absl::StrCat("unshare(CLONE_NEWUSER | CLONE_NEWNS): ", std::strerror(errno));
    }
    if (!WriteFile("/proc/self/setgroups", "deny") ||
        !WriteFile("/proc/self/uid_map", absl::StrCat("0 ", uid, " 1")) ||
        !WriteFile("/proc/self/gid_map", absl::StrCat("0 ", gid, " 1"))) {
      return "cannot map our user into the user namespace";
    }
  } else if (unshare(CLONE_NEWNS) != 0) {
    return absl::StrCat("unshare(CLONE_NEWNS): ", std::strerror(errno));
  }
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return absl::StrCat("making / private: ", std::strerror(errno));
  }
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, absl::StrCat("size=", size).c_str()) != 0) {
    return absl::StrCat("mount tmpfs on ", dir, ": ", std::strerror(errno));
  }
  return "";
}

// Writes zeros to `path` until the file system is full.
inline void FillUp(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const std::string block(4096, '\0');
  while (fd >= 0 && write(fd, block.data(), block.size()) > 0) {
  }
  if (fd >= 0) close(fd);
}

// Remounts the tmpfs at `dir` read-only (true) or writable (false).
inline bool RemountReadOnly(const std::string& dir, bool read_only) {
  return mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | (read_only ? MS_RDONLY : 0),
               nullptr) == 0;
}

// Forks; the child mounts a private tmpfs of `size` on a fresh directory
// and returns `scenario(dir)`: the problems found, one a line, empty when
// none. Returns "OK", the problems, "SKIP: why" where namespaces or tmpfs
// mounts are forbidden, or what became of a child that died.
inline std::string RunInPrivateTmpfs(const char* size,
                                     const std::function<std::string(const std::string&)>& scenario) {
  char tmpl[] = "/tmp/dynmo_tmpfs_XXXXXX";
  const std::string mnt = mkdtemp(tmpl);
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    close(fds[0]);
    std::string out = MountPrivateTmpfs(mnt, size);
    out = out.empty() ? scenario(mnt) : "SKIP: " + out;
    if (out.empty()) out = "OK";
    const ssize_t written = write(fds[1], out.data(), out.size());
    _exit(written == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::filesystem::remove_all(mnt);  // the tmpfs went with the child's namespace
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) return "the child died: " + out;
  return out;
}

}  // namespace dynmo::service

#endif  // DYNMO_TESTS_SERVICE_PRIVATE_TMPFS_H_
