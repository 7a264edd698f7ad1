// Megatron-LM's memory-mapped indexed dataset ("MMIDIDX"), read-only.
//
// PREFIX.idx, little-endian:
//   9 bytes  magic "MMIDIDX\0\0"
//   u64      version (1)
//   u8       dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//            8 uint16 (6 and 7 are floating point: rejected here)
//   u64      number of sequences S
//   u64      number of document-index entries D
//   i32[S]   sequence lengths in tokens
//   i64[S]   byte offset of each sequence in PREFIX.bin
//   i64[D]   document index (sequence ids where documents start)
// PREFIX.bin: the sequences' tokens back to back.
//
// IndexedDataset maps both files and exposes the sequences, in order, as one
// TokenCorpus. Immutable after Open; thread-safe for reads.
// WriteIndexedDataset writes the same format (for tests and for turning text
// into the format Megatron tools read).
#ifndef DYNMO_TRAINER_DATA_INDEXED_DATASET_H_
#define DYNMO_TRAINER_DATA_INDEXED_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/data/token_corpus.h"

namespace dynmo::trainer {

enum class IndexedDType : uint8_t {
  kUInt8 = 1, kInt8 = 2, kInt16 = 3, kInt32 = 4, kInt64 = 5, kUInt16 = 8,
};

class IndexedDataset : public TokenCorpus {
 public:
  // Maps PREFIX.idx and PREFIX.bin. Errors name the file and what is wrong
  // (missing, bad magic, unsupported version or dtype, truncated, offsets
  // past the end of .bin).
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> Open(
      const std::string& prefix);
  ~IndexedDataset() override;

  int64_t num_sequences() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t num_documents() const {
    return doc_idx_.empty() ? 0 : static_cast<int64_t>(doc_idx_.size()) - 1;
  }
  IndexedDType dtype() const { return dtype_; }
  // Tokens of sequence i.
  std::vector<int64_t> Sequence(int64_t i) const;

  int64_t size() const override { return total_tokens_; }
  void Read(int64_t start, absl::Span<int64_t> out) const override;
  int64_t max_token() const override { return max_token_; }
  std::string description() const override { return "mmidx:" + prefix_; }

 private:
  IndexedDataset() = default;
  int64_t TokenAt(int64_t byte_offset) const;

  std::string prefix_;
  IndexedDType dtype_ = IndexedDType::kUInt16;
  int token_bytes_ = 2;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_idx_;
  std::vector<int64_t> stream_starts_;  // token position where sequence i starts
  int64_t total_tokens_ = 0;
  int64_t max_token_ = 0;
  const uint8_t* bin_ = nullptr;
  size_t bin_bytes_ = 0;
};

// Writes PREFIX.bin and PREFIX.idx holding `documents`, one sequence per
// document. Errors: a token that does not fit `dtype`, I/O failures.
absl::Status WriteIndexedDataset(const std::string& prefix, IndexedDType dtype,
                                 absl::Span<const std::vector<int64_t>> documents);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DATA_INDEXED_DATASET_H_
