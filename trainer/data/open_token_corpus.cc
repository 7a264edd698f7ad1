#include "trainer/data/open_token_corpus.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/match.h"
#include "trainer/data/indexed_dataset.h"

namespace dynmo::trainer {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenCorpus>> OpenTokenCorpus(const std::string& path) {
  std::string prefix;
  if (absl::EndsWith(path, ".bin") || absl::EndsWith(path, ".idx")) {
    prefix = path.substr(0, path.size() - 4);
  } else if (!FileExists(path) && FileExists(path + ".idx")) {
    prefix = path;
  }
  if (!prefix.empty()) {
    absl::StatusOr<std::unique_ptr<IndexedDataset>> ds = IndexedDataset::Open(prefix);
    if (!ds.ok()) return ds.status();
    return std::unique_ptr<TokenCorpus>(std::move(*ds));
  }
  return OpenByteTextCorpus(path);
}

}  // namespace dynmo::trainer
