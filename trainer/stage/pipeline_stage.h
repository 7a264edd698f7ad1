// PipelineStage: one rank's slice [b[s], b[s+1]) of the GPT layers, with one
// AdamW per layer (so a layer's optimizer state is its own and can move with
// it), driven through one iteration by the 1F1B executor.
//
// Everything lives on the rank's device (config.device, device.h): layers,
// their AdamW state, activations, gradients and the loss; on cuda nothing
// goes through host memory in the steady state (the summed loss is read
// once per iteration).
//
// Each layer runs on a detached copy of its input, so backward runs layer
// by layer: that is how the per-layer backward time is measured (a
// LayerClock: the steady clock on cpu, CUDA events read once per iteration
// on cuda), and it makes the arithmetic of a
// stage independent of where the stage boundaries are — pp=1 and pp=4 run
// the same kernels on the same tensors in the same order.
//
// The loss of micro-batch i is the head's mean cross-entropy; backward
// scales it by 1/M so the accumulated gradient is that of the mean over the
// M micro-batches, then averages it over the dp replicas (one flattened
// all-reduce per stage) before the optimizer step.
// Not thread-safe; owned by the rank's training thread.
#ifndef DYNMO_TRAINER_STAGE_PIPELINE_STAGE_H_
#define DYNMO_TRAINER_STAGE_PIPELINE_STAGE_H_

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/boundaries.h"
#include "core/migration.h"
#include "trainer/comm/transport.h"
#include "trainer/config/config.h"
#include "trainer/data/token_corpus.h"
#include "trainer/dynamism/dynamism.h"
#include "trainer/model/gpt_layers.h"
#include "trainer/stage/activation_meter.h"
#include "trainer/stage/layer_clock.h"
#include "trainer/stage/one_f_one_b.h"
#include "trainer/stage/op_timeline.h"
#include "trainer/state/layer_state.h"

namespace dynmo::trainer {

// What one iteration of one stage measured.
struct StageIterationStats {
  double loss_sum = 0;  // sum of micro-batch losses (last stage only)
  // Per local layer (index 0 = layer b[s]), summed over micro-batches.
  std::vector<double> forward_s;
  std::vector<double> backward_s;      // input + weight gradient
  // The share of each layer's backward that is its input gradient (the rest,
  // backward_s * (1 - share), is its weight gradient), measured on
  // micro-batch 0 every kGradientSplitEvery iterations (and after the
  // stage's layers changed) by an input-gradient-only pass
  // (torch::autograd::grad w.r.t. the layer input: the engine skips every
  // weight-gradient edge) next to the full backward. 1 until measured and
  // without per-layer clocks. The report splits the times with it
  // (iteration_report.h).
  std::vector<double> input_grad_share;
  // Per local layer: the most bytes one micro-batch's forward of the layer
  // left allocated (output + what autograd saved), activation_meter.h.
  std::vector<int64_t> activation_bytes;
  // The most bytes of activations stashed at once (stage_memory.h).
  int64_t peak_stash_bytes = 0;
  // Host seconds in the point-to-point exchanges, waiting included.
  double exchange_s = 0;
};

class PipelineStage : public StageOps {
 public:
  // How often the input/weight-gradient split is measured again.
  static constexpr int kGradientSplitEvery = 10;

  // Builds layers [b[stage], b[stage+1]) and their optimizers. `transport`
  // and `corpus` must outlive the stage.
  PipelineStage(const TrainerConfig& config, const core::Boundaries& b,
                int stage, int dp_rank, Transport* transport,
                const TokenCorpus* corpus);

  // Zeroes gradients, runs the 1F1B schedule for iteration `iter`, averages
  // gradients over the dp group and steps every layer's optimizer.
  absl::Status RunIteration(int64_t iter, StageIterationStats* stats);
  // Times every schedule operation of the iterations `timeline` covers
  // (op_timeline.h; null: none). It must outlive the stage's iterations.
  void set_timeline(OpTimeline* timeline) { timeline_ = timeline; }

  // Moves layers at an iteration boundary: walks `plan` in order, sending
  // the layers this stage gives away and receiving the ones it gains (with
  // the same dp replica of the peer stage), then holds [to[s], to[s+1]).
  // Every rank of the job must call it with the same plan.
  absl::Status ApplyMigration(const core::MigrationPlan& plan,
                              const core::Boundaries& to);

  // True once after a dynamic-model scheme changed per-layer costs.
  bool TakeModelChanged();
  // The dynamic-model schemes' counters in the iteration report (dynamism.h,
  // iteration_report.h): how many slots they take, filled with this rank's
  // counts after RunIteration, and handed their world sums once the
  // report's all-reduce is done.
  int DynamismReportSlots() const;
  void FillDynamismReport(absl::Span<double> slots);
  void DynamismReportSummed(int64_t iter, absl::Span<const double> slots);

  // Elastic re-packing: after a migration that left this stage its slice,
  // the job runs on `num_stages` stages over `transport` (new numbering) and
  // this stage is stage `stage` of them. The layers stay as they are.
  void Rebind(int stage, int num_stages, Transport* transport);

  // Elastic re-shaping: this rank is now replica `dp_rank` of stage `stage`
  // of a `num_stages` x `dp` grid over `transport`, holds `layers` (their
  // ids consecutive, as a re-shape step delivers them) and runs
  // `microbatches` micro-batches per iteration.
  void Regroup(int stage, int num_stages, int dp, int dp_rank, int microbatches,
               std::vector<OwnedLayer> layers, Transport* transport);

  int first_layer() const { return first_layer_; }
  // This rank's layers, ids first_layer() + i (checkpoints, memory).
  std::vector<OwnedLayer>& layers() { return layers_; }
  int num_local_layers() const { return static_cast<int>(layers_.size()); }

  // StageOps (called by RunOneFOneB).
  absl::Status RecvForward(int mb) override;
  absl::Status Forward(int mb) override;
  absl::Status SendForward(int mb) override;
  absl::Status SendForwardRecvBackward(int send_mb, int recv_mb) override;
  absl::Status Backward(int mb) override;
  absl::Status SendBackward(int mb) override;
  absl::Status SendBackwardRecvForward(int send_mb, int recv_mb) override;
  absl::Status RecvBackward(int mb) override;

 private:
  // Tensors of one micro-batch between its forward and its backward.
  struct InFlight {
    torch::Tensor input;        // received activation (not on the first stage)
    torch::Tensor token_mask;   // early exit: [B, T] uint8 received with it
    MicroBatchContext context;
    std::vector<torch::Tensor> layer_inputs;
    std::vector<torch::Tensor> layer_outputs;
    // Per layer: the sum of the auxiliary losses it added (undefined: none).
    std::vector<torch::Tensor> layer_aux_losses;
    torch::Tensor output_grad;  // received from downstream
    torch::Tensor input_grad;   // to send upstream
  };

  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == num_stages_ - 1; }
  torch::Tensor ActivationBuffer() const;
  torch::Tensor TokensOnDevice(std::vector<int64_t>& data) const;
  absl::Status AverageGradientsOverDataParallel();
  // The input/weight-gradient split (StageIterationStats::input_grad_share):
  // whether this iteration probes it, and the shares it measured.
  void PrepareGradientSplit(int64_t iter);
  void FinishGradientSplit(StageIterationStats* stats);
  // Bytes of the distinct storages every in-flight micro-batch holds.
  int64_t StashedBytes() const;
  StageView View();
  // Layer freezing: whether gradients cross this stage's input / output
  // boundary. Both neighbours derive it from the job-wide frozen prefix and
  // the boundary, so the point-to-point pattern stays matched.
  bool InputCarriesGrad() const { return first_layer_ > frozen_prefix_; }
  bool OutputCarriesGrad() const {
    return first_layer_ + num_local_layers() > frozen_prefix_;
  }
  // Early exit: the [B, T] token mask sent after micro-batch mb's activation.
  torch::Tensor OutgoingMask(int mb) const;
  torch::Tensor MaskBuffer() const;

  TrainerConfig config_;
  torch::Device device_;
  LayerClock clock_;
  ActivationMeter meter_;
  // The input-gradient share of each local layer's backward (-1 = not
  // measured yet), for the layer ids in split_ids_; and this iteration's
  // probe clocks (input-gradient-only pass, full backward, micro-batch 0).
  std::vector<double> input_grad_share_;
  std::vector<int> split_ids_;
  bool probe_split_ = false;
  std::vector<double> probe_input_s_;
  std::vector<double> probe_full_s_;
  torch::Tensor loss_sum_;  // on the device, read once per iteration
  int stage_;
  int num_stages_;
  int dp_rank_;
  int prev_rank_ = -1;
  int next_rank_ = -1;
  int first_layer_;
  Transport* transport_;
  const TokenCorpus* corpus_;
  std::vector<OwnedLayer> layers_;  // ids first_layer_, first_layer_ + 1, ...
  std::vector<InFlight> in_flight_;
  std::vector<std::unique_ptr<Dynamism>> dynamisms_;
  OpTimeline* timeline_ = nullptr;
  int frozen_prefix_ = 0;    // StageView::frozen_prefix (freezing.h)
  bool early_exit_ = false;  // the token mask travels with activations
  int64_t iter_ = 0;
  StageIterationStats* stats_ = nullptr;
};

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_STAGE_PIPELINE_STAGE_H_
