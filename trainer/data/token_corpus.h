// TokenCorpus: a read-only stream of token ids that training samples are cut
// from. Two sources:
//   ByteTextCorpus   a plain text file, one token per byte (vocab 256);
//   IndexedDataset   Megatron-LM's memory-mapped indexed dataset (the
//                    .bin/.idx pair, "MMIDIDX" version 1, what Megatron and
//                    DeepSpeed preprocessing writes); its documents are read
//                    back to back as one stream. See indexed_dataset.h.
// OpenTokenCorpus (open_token_corpus.h) picks the source from the path. Implementations are
// immutable after opening and thread-safe for concurrent reads.
#ifndef DYNMO_TRAINER_DATA_TOKEN_CORPUS_H_
#define DYNMO_TRAINER_DATA_TOKEN_CORPUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dynmo::trainer {

class TokenCorpus {
 public:
  virtual ~TokenCorpus() = default;
  // Number of tokens in the stream.
  virtual int64_t size() const = 0;
  // Copies tokens [start, start + out.size()) into `out`.
  // Precondition: start >= 0 and start + out.size() <= size().
  virtual void Read(int64_t start, absl::Span<int64_t> out) const = 0;
  // The largest token id present, for checking against --vocab.
  virtual int64_t max_token() const = 0;
  // What was opened, for logs ("text:path" / "mmidx:prefix").
  virtual std::string description() const = 0;
};

// The bytes of a text file as tokens 0..255. Errors: unreadable or empty file.
absl::StatusOr<std::unique_ptr<TokenCorpus>> OpenByteTextCorpus(
    const std::string& path);

// Training samples: window k of the stream is tokens [k*seq_len, k*seq_len +
// seq_len + 1) modulo the stream (inputs are the first seq_len tokens,
// targets the last seq_len). Sample g of iteration `iter` for data-parallel
// replica `dp_rank`, micro-batch `mb`, row `row` is window
//   iter * (dp * M * B) + dp_rank * (M * B) + mb * B + row,
// so every stage of one replica sees the same tokens and dp replicas split
// the global batch without overlap.
struct SampleLayout {
  int seq_len = 0;
  int micro_batch = 0;   // B
  int microbatches = 0;  // M
  int dp = 1;
};

// Fills inputs and targets ([B, seq_len] row-major each) for one micro-batch.
// Precondition: corpus.size() > seq_len.
void FillMicroBatch(const TokenCorpus& corpus, const SampleLayout& layout,
                    int64_t iter, int dp_rank, int mb,
                    std::vector<int64_t>* inputs, std::vector<int64_t>* targets);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DATA_TOKEN_CORPUS_H_
