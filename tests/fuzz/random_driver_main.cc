// A stand-in for libFuzzer's driver in the ordinary (gcc) build: feeds the
// target `--runs` inputs of random bytes (lengths up to `--max_len`) from a
// seeded generator, so a bounded run is the same run every time, and
// replays any files given as arguments (a crash's reproducer). The
// coverage-guided run is scripts/fuzz.sh (clang, -fsanitize=fuzzer).
//
//   fuzz-target [--runs=N] [--seed=S] [--max_len=L] [FILE...]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  long runs = 2000;
  unsigned long seed = 1;
  size_t max_len = 2048;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--runs=", 0) == 0) {
      runs = std::strtol(a.c_str() + 7, nullptr, 10);
    } else if (a.rfind("--seed=", 0) == 0) {
      seed = std::strtoul(a.c_str() + 7, nullptr, 10);
    } else if (a.rfind("--max_len=", 0) == 0) {
      max_len = std::strtoul(a.c_str() + 10, nullptr, 10);
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    } else {
      files.push_back(a);
    }
  }
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::mt19937_64 gen(seed);
  std::vector<uint8_t> buf;
  for (long r = 0; r < runs; ++r) {
    buf.resize(gen() % (max_len + 1));
    for (auto& b : buf) b = static_cast<uint8_t>(gen());
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("%ld random inputs (seed %lu, up to %zu bytes) and %zu files: no crash, "
              "no broken invariant\n", runs, seed, max_len, files.size());
  return 0;
}
