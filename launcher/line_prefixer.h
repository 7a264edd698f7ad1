// LinePrefixer: turns the byte stream of one rank's stdout or stderr into
// whole lines that each start with a prefix such as "[rank 2] ". Bytes come
// in arbitrary chunks (a pipe read may end mid-line); an unfinished line is
// held back until its newline arrives, so one rank's line is always written
// in one piece and never interleaved with another's. A line longer than
// max_line bytes is cut into several prefixed lines rather than buffered
// without bound. Pure (no I/O); not thread-safe.
#ifndef DYNMO_LAUNCHER_LINE_PREFIXER_H_
#define DYNMO_LAUNCHER_LINE_PREFIXER_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace dynmo::launcher {

class LinePrefixer {
 public:
  explicit LinePrefixer(std::string prefix, size_t max_line = 64 << 10)
      : prefix_(std::move(prefix)), max_line_(max_line) {}

  // Returns the lines completed by `bytes`, each prefixed and ending in
  // '\n' (empty when none completed); keeps an unfinished tail.
  std::string Append(absl::string_view bytes);

  // Returns the held-back unfinished line, prefixed and given a '\n', or ""
  // when nothing is held back. Call at end of stream.
  std::string Finish();

 private:
  const std::string prefix_;
  const size_t max_line_;
  std::string pending_;
};

}  // namespace dynmo::launcher

#endif  // DYNMO_LAUNCHER_LINE_PREFIXER_H_
