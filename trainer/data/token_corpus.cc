#include "trainer/data/token_corpus.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace dynmo::trainer {
namespace {

class ByteTextCorpus : public TokenCorpus {
 public:
  ByteTextCorpus(std::string path, std::string bytes)
      : path_(std::move(path)), bytes_(std::move(bytes)) {
    for (unsigned char c : bytes_) max_ = std::max<int64_t>(max_, c);
  }
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  void Read(int64_t start, absl::Span<int64_t> out) const override {
    for (size_t k = 0; k < out.size(); ++k) {
      out[k] = static_cast<unsigned char>(bytes_[start + k]);
    }
  }
  int64_t max_token() const override { return max_; }
  std::string description() const override { return "text:" + path_; }

 private:
  std::string path_;
  std::string bytes_;
  int64_t max_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TokenCorpus>> OpenByteTextCorpus(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open --data=", path));
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--data=", path, " is empty"));
  }
  return std::unique_ptr<TokenCorpus>(new ByteTextCorpus(path, std::move(bytes)));
}

void FillMicroBatch(const TokenCorpus& corpus, const SampleLayout& layout,
                    int64_t iter, int dp_rank, int mb,
                    std::vector<int64_t>* inputs, std::vector<int64_t>* targets) {
  const int T = layout.seq_len;
  const int64_t per_replica =
      static_cast<int64_t>(layout.microbatches) * layout.micro_batch;
  const int64_t first = iter * layout.dp * per_replica + dp_rank * per_replica +
                        static_cast<int64_t>(mb) * layout.micro_batch;
  // Window starts wrap so that a whole window always fits.
  const int64_t span = corpus.size() - T;  // > 0 by precondition
  inputs->resize(static_cast<size_t>(layout.micro_batch) * T);
  targets->resize(inputs->size());
  std::vector<int64_t> window(T + 1);
  for (int row = 0; row < layout.micro_batch; ++row) {
    const int64_t start = ((first + row) * T) % span;
    corpus.Read(start, absl::MakeSpan(window));
    std::copy(window.begin(), window.end() - 1, inputs->begin() + row * T);
    std::copy(window.begin() + 1, window.end(), targets->begin() + row * T);
  }
}

}  // namespace dynmo::trainer
