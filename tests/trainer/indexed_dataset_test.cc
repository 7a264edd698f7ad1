// The Megatron MMIDIDX reader (round trip through the writer, byte layout,
// corrupt files), byte-level text and how samples are cut from a corpus.
#include "trainer/data/indexed_dataset.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/data/open_token_corpus.h"
#include "trainer/data/token_corpus.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

std::string TempPrefix(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(IndexedDatasetTest, RoundTripsDocumentsForEveryIntegerDtype) {
  const std::vector<std::vector<int64_t>> docs = {{1, 2, 3}, {}, {40, 50}, {7}};
  for (IndexedDType t : {IndexedDType::kUInt8, IndexedDType::kInt8,
                         IndexedDType::kInt16, IndexedDType::kUInt16,
                         IndexedDType::kInt32, IndexedDType::kInt64}) {
    const std::string prefix = TempPrefix("roundtrip");
    ASSERT_TRUE(WriteIndexedDataset(prefix, t, docs).ok());
    absl::StatusOr<std::unique_ptr<IndexedDataset>> ds = IndexedDataset::Open(prefix);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ((*ds)->dtype(), t);
    ASSERT_EQ((*ds)->num_sequences(), 4);
    EXPECT_EQ((*ds)->num_documents(), 4);
    for (int i = 0; i < 4; ++i) EXPECT_EQ((*ds)->Sequence(i), docs[i]);
    EXPECT_EQ((*ds)->size(), 6);
    EXPECT_EQ((*ds)->max_token(), 50);
    std::vector<int64_t> all(6);
    (*ds)->Read(0, absl::MakeSpan(all));
    EXPECT_EQ(all, (std::vector<int64_t>{1, 2, 3, 40, 50, 7}));
    std::vector<int64_t> middle(3);
    (*ds)->Read(2, absl::MakeSpan(middle));  // crosses the empty sequence
    EXPECT_EQ(middle, (std::vector<int64_t>{3, 40, 50}));
  }
}

TEST(IndexedDatasetTest, IndexHasMegatronByteLayout) {
  const std::string prefix = TempPrefix("layout");
  ASSERT_TRUE(WriteIndexedDataset(prefix, IndexedDType::kUInt16, {{{5, 6, 7}}}).ok());
  const std::string idx = ReadFile(prefix + ".idx");
  ASSERT_EQ(idx.size(), 9u + 8 + 1 + 8 + 8 + 4 + 8 + 2 * 8);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(idx[9], 1);    // version, little-endian u64
  EXPECT_EQ(idx[17], 8);   // dtype code: uint16
  EXPECT_EQ(idx[18], 1);   // one sequence
  EXPECT_EQ(idx[26], 2);   // two document-index entries: 0, 1
  EXPECT_EQ(idx[34], 3);   // its length
  const std::string bin = ReadFile(prefix + ".bin");
  EXPECT_EQ(bin, std::string("\x05\0\x06\0\x07\0", 6));
}

TEST(IndexedDatasetTest, RejectsCorruptOrMissingFiles) {
  EXPECT_EQ(IndexedDataset::Open(TempPrefix("missing")).status().code(),
            absl::StatusCode::kNotFound);

  const std::string prefix = TempPrefix("corrupt");
  ASSERT_TRUE(WriteIndexedDataset(prefix, IndexedDType::kUInt16, {{{1, 2}}}).ok());
  std::string idx = ReadFile(prefix + ".idx");
  {
    std::ofstream(prefix + ".idx", std::ios::binary) << "NOTANIDX";
    EXPECT_THAT(IndexedDataset::Open(prefix).status().message(), HasSubstr("magic"));
  }
  {
    std::string bad = idx;
    bad[17] = 6;  // float64
    std::ofstream(prefix + ".idx", std::ios::binary) << bad;
    EXPECT_THAT(IndexedDataset::Open(prefix).status().message(), HasSubstr("dtype"));
  }
  {
    std::ofstream(prefix + ".idx", std::ios::binary) << idx.substr(0, idx.size() - 4);
    EXPECT_THAT(IndexedDataset::Open(prefix).status().message(), HasSubstr("truncated"));
  }
  {
    std::ofstream(prefix + ".idx", std::ios::binary) << idx;
    std::ofstream(prefix + ".bin", std::ios::binary) << "x";  // too short
    EXPECT_THAT(IndexedDataset::Open(prefix).status().message(), HasSubstr("past the end"));
  }
}

TEST(IndexedDatasetTest, WriterRejectsTokensThatDoNotFit) {
  EXPECT_FALSE(
      WriteIndexedDataset(TempPrefix("fit"), IndexedDType::kUInt8, {{{256}}}).ok());
}

TEST(TokenCorpusTest, OpensTextAsBytesAndPrefixesAsIndexedDatasets) {
  const std::string text = TempPrefix("corpus") + ".txt";
  std::ofstream(text) << "abc";
  absl::StatusOr<std::unique_ptr<TokenCorpus>> c = OpenTokenCorpus(text);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->size(), 3);
  EXPECT_EQ((*c)->max_token(), 'c');
  std::vector<int64_t> out(3);
  (*c)->Read(0, absl::MakeSpan(out));
  EXPECT_EQ(out, (std::vector<int64_t>{'a', 'b', 'c'}));

  const std::string prefix = TempPrefix("corpus_mm");
  ASSERT_TRUE(WriteIndexedDataset(prefix, IndexedDType::kInt32, {{{9, 8}}}).ok());
  for (const std::string& path : {prefix, prefix + ".bin", prefix + ".idx"}) {
    absl::StatusOr<std::unique_ptr<TokenCorpus>> m = OpenTokenCorpus(path);
    ASSERT_TRUE(m.ok()) << path;
    EXPECT_EQ((*m)->size(), 2);
    EXPECT_THAT((*m)->description(), HasSubstr("mmidx:"));
  }
  EXPECT_FALSE(OpenTokenCorpus(TempPrefix("nothing_here")).ok());
}

TEST(TokenCorpusTest, MicroBatchesShiftTargetsAndSplitTheBatchAcrossReplicas) {
  const std::string prefix = TempPrefix("samples");
  std::vector<int64_t> stream(100);
  for (int i = 0; i < 100; ++i) stream[i] = i;
  ASSERT_TRUE(WriteIndexedDataset(prefix, IndexedDType::kInt32, {stream}).ok());
  std::unique_ptr<IndexedDataset> ds = *IndexedDataset::Open(prefix);
  const SampleLayout layout{/*seq_len=*/4, /*micro_batch=*/2, /*microbatches=*/3, /*dp=*/2};
  std::vector<int64_t> in, tgt;
  // Iteration 1, replica 1, micro-batch 2: first window 1*12 + 1*6 + 2*2 = 22.
  FillMicroBatch(*ds, layout, 1, 1, 2, &in, &tgt);
  EXPECT_EQ(in, (std::vector<int64_t>{88, 89, 90, 91, 92, 93, 94, 95}));
  EXPECT_EQ(tgt, (std::vector<int64_t>{89, 90, 91, 92, 93, 94, 95, 96}));
  // Windows wrap so a whole window always fits: window 24 starts at 96 % 96.
  FillMicroBatch(*ds, layout, 2, 0, 0, &in, &tgt);
  EXPECT_EQ(in[0], 0);
}

}  // namespace
}  // namespace dynmo::trainer
