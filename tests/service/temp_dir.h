// TempDir: a fresh directory under /tmp for one service test (a state dir,
// a socket's folder), named /tmp/dynmo_<kind>_XXXXXX; the test removes it.
// Test-only; thread-safe (mkdtemp).
#ifndef DYNMO_TESTS_SERVICE_TEMP_DIR_H_
#define DYNMO_TESTS_SERVICE_TEMP_DIR_H_

#include <stdlib.h>

#include <string>

namespace dynmo::service {

inline std::string TempDir(const std::string& kind = "job") {
  std::string tmpl = "/tmp/dynmo_" + kind + "_XXXXXX";
  return mkdtemp(tmpl.data());
}

}  // namespace dynmo::service

#endif  // DYNMO_TESTS_SERVICE_TEMP_DIR_H_
