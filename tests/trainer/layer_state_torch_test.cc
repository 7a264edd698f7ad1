// LayerState (trainer/state/layer_state.h): a layer's named parameters and
// buffers, its AdamW state and its metadata survive capture -> encode ->
// decode -> restore (and a file round trip) bit for bit, including tensors
// whose size changed while training, and mismatched or damaged states are
// rejected with clear errors.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/state/layer_state.h"

namespace dynmo::trainer {
namespace {

using ::testing::HasSubstr;

TrainerConfig TinyConfig() {
  TrainerConfig c;
  c.model.num_blocks = 2;
  c.model.hidden = 16;
  c.model.heads = 2;
  c.model.seq_len = 8;
  c.model.vocab = 32;
  c.lr = 0.01;
  return c;
}

// One AdamW step on `owned` from a deterministic loss.
void TrainStep(OwnedLayer& owned, int seed) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn({2, 8, 16});
  MicroBatchContext ctx;
  owned.optimizer->zero_grad();
  owned.layer->Forward(x, ctx).pow(2).mean().backward();
  owned.optimizer->step();
}

void ExpectSameTensors(const OwnedLayer& a, const OwnedLayer& b) {
  auto pa = a.layer->named_parameters(), pb = b.layer->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) {
    const torch::Tensor* other = pb.find(item.key());
    ASSERT_NE(other, nullptr) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), *other)) << item.key();
  }
  auto ba = a.layer->named_buffers(), bb = b.layer->named_buffers();
  ASSERT_EQ(ba.size(), bb.size());
  for (const auto& item : ba) {
    EXPECT_TRUE(torch::equal(item.value(), *bb.find(item.key()))) << item.key();
  }
}

TEST(LayerStateTest, RestoredBlockTrainsOnBitIdenticallyToTheOriginal) {
  const TrainerConfig config = TinyConfig();
  OwnedLayer original = MakeOwnedLayer(config, 1);
  TrainStep(original, 1);
  TrainStep(original, 2);
  const LayerState captured = CaptureLayerState(original);
  EXPECT_EQ(captured.optimizer.size(), captured.parameters.size());
  EXPECT_EQ(captured.optimizer.front().step, 2);
  EXPECT_FALSE(captured.buffers.empty());  // the causal mask travels too
  torch::Tensor bytes = EncodeLayerState(captured);
  absl::StatusOr<LayerState> decoded =
      DecodeLayerState(absl::MakeConstSpan(bytes.data_ptr<uint8_t>(), bytes.numel()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->PayloadBytes(), captured.PayloadBytes());
  absl::StatusOr<OwnedLayer> restored = RestoreLayer(config, *decoded);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ExpectSameTensors(original, *restored);
  // The optimizer state came along: the next step is the same on both.
  TrainStep(original, 3);
  TrainStep(*restored, 3);
  ExpectSameTensors(original, *restored);
}

// A layer whose weight shrinks as it is pruned, stored as CSR buffers whose
// lengths change, with its pruned flag and nnz as metadata.
class PrunableTestLayer : public PipelineLayer, public LayerMetadataHook {
 public:
  explicit PrunableTestLayer(int id) : PipelineLayer(id, LayerKind::kBlock) {
    weight_ = register_parameter("weight", torch::ones({4, 4}));
    values_ = register_buffer("csr_values", torch::zeros({16}));
    col_idx_ = register_buffer("csr_col_idx", torch::zeros({16}, torch::kLong));
    row_ptr_ = register_buffer("csr_row_ptr", torch::zeros({5}, torch::kInt));
  }
  torch::Tensor Forward(const torch::Tensor& x, MicroBatchContext&) override {
    return x.matmul(weight_);
  }
  std::vector<int64_t> SaveMetadata() const override { return {pruned_, nnz_}; }
  absl::Status RestoreMetadata(absl::Span<const int64_t> m) override {
    if (m.size() != 2) return absl::InvalidArgumentError("want {pruned, nnz}");
    pruned_ = m[0];
    nnz_ = m[1];
    return absl::OkStatus();
  }
  void Prune(int nnz) {
    torch::NoGradGuard no_grad;
    pruned_ = 1;
    nnz_ = nnz;
    weight_.set_data(torch::arange(6, torch::kFloat).view({2, 3}));
    values_.set_data(torch::arange(nnz, torch::kFloat) * 0.5);
    col_idx_.set_data(torch::arange(nnz, torch::kLong) % 4);
    row_ptr_.set_data(torch::tensor({0, 1, 2, 3, nnz}, torch::kInt));
  }
  int64_t pruned_ = 0, nnz_ = 16;
  torch::Tensor weight_, values_, col_idx_, row_ptr_;
};

OwnedLayer OwnedPrunable(int id) {
  OwnedLayer owned;
  auto layer = std::make_shared<PrunableTestLayer>(id);
  owned.layer = layer;
  owned.optimizer = std::make_unique<torch::optim::AdamW>(
      layer->parameters(), torch::optim::AdamWOptions(0.01));
  return owned;
}

TEST(LayerStateTest, TensorsThatChangedSizeAndMetadataAreCarriedByName) {
  OwnedLayer pruned = OwnedPrunable(3);
  auto* layer = static_cast<PrunableTestLayer*>(pruned.layer.get());
  layer->Prune(5);
  torch::Tensor bytes = EncodeLayerState(CaptureLayerState(pruned));
  absl::StatusOr<LayerState> decoded =
      DecodeLayerState(absl::MakeConstSpan(bytes.data_ptr<uint8_t>(), bytes.numel()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();

  absl::StatusOr<OwnedLayer> restored = RestoreLayerInto(OwnedPrunable(3), *decoded);
  ASSERT_TRUE(restored.ok()) << restored.status();
  auto* fresh = static_cast<PrunableTestLayer*>(restored->layer.get());
  EXPECT_EQ(fresh->pruned_, 1);
  EXPECT_EQ(fresh->nnz_, 5);
  // The members the layer computes with see the new sizes and dtypes.
  EXPECT_EQ(fresh->weight_.sizes().vec(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(fresh->values_.numel(), 5);
  EXPECT_EQ(fresh->col_idx_.scalar_type(), torch::kLong);
  EXPECT_EQ(fresh->row_ptr_.scalar_type(), torch::kInt);
  ExpectSameTensors(pruned, *restored);
  // The resized parameter is still the one its optimizer steps.
  MicroBatchContext ctx;
  restored->layer->Forward(torch::ones({1, 2}), ctx).sum().backward();
  restored->optimizer->step();
  EXPECT_FALSE(torch::equal(fresh->weight_, layer->weight_));
}

TEST(LayerStateTest, FileRoundTripIsExactAndAtomic) {
  const TrainerConfig config = TinyConfig();
  OwnedLayer head = MakeOwnedLayer(config, config.model.num_pipeline_layers() - 1);
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/layer_state_", getpid(), ".state");
  ASSERT_TRUE(WriteLayerStateFile(CaptureLayerState(head), path).ok());
  EXPECT_FALSE(std::ifstream(absl::StrCat(path, ".tmp.", getpid())).good());
  absl::StatusOr<LayerState> read = ReadLayerStateFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  absl::StatusOr<OwnedLayer> restored = RestoreLayer(config, *read);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ExpectSameTensors(head, *restored);
  std::remove(path.c_str());
}

TEST(LayerStateTest, DamagedOrMismatchedStatesAreErrors) {
  const TrainerConfig config = TinyConfig();
  OwnedLayer block = MakeOwnedLayer(config, 1);
  torch::Tensor bytes = EncodeLayerState(CaptureLayerState(block));
  const auto* data = bytes.data_ptr<uint8_t>();

  absl::StatusOr<LayerState> truncated =
      DecodeLayerState(absl::MakeConstSpan(data, bytes.numel() - 3));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(truncated.status().message(), HasSubstr("truncated"));
  std::vector<uint8_t> garbage = {'n', 'o', 't', ' ', 'a', ' ', 's', 't', 'a', 't', 'e', '!',
                                  0, 0, 0, 0};
  EXPECT_THAT(DecodeLayerState(garbage).status().message(), HasSubstr("bad magic"));

  // A block's state into the embedding: the names do not match.
  LayerState state = CaptureLayerState(block);
  state.id = 0;
  absl::StatusOr<OwnedLayer> wrong = RestoreLayer(config, state);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("layer 0"));
  // Metadata for a layer that takes none.
  state = CaptureLayerState(block);
  state.metadata = {1};
  EXPECT_THAT(RestoreLayer(config, state).status().message(),
              HasSubstr("takes none"));
}

}  // namespace
}  // namespace dynmo::trainer
