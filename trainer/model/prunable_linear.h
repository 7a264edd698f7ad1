// PrunableLinear: a linear layer y = x·Wᵀ + b that gradual magnitude pruning
// can thin out while training, in one of three forms:
//
//   dense   W [out, in] as a dense parameter: exactly torch::nn::Linear
//           (same init draws, same names, same kernels), so a job without
//           --dynamism=pruning computes bit-identically to before.
//   masked  pruned: W stays dense, a bool `mask` buffer [out, in] marks the
//           survivors and the forward uses W ⊙ mask (a dense GEMM: faster
//           than CSR at low sparsity, and on a GPU at any sparsity we see).
//   csr     the "weight" parameter holds only the nnz surviving values
//           [nnz], with buffers `row_ptr` [out + 1] and `col_idx` [nnz];
//           forward and backward run CSR kernels, so the layer's work is
//           ∝ nnz. Two implementations, told apart by the index dtype:
//           int32 = our kernels (csr_linear.h; CPU), int64 = LibTorch's
//           sparse CSR operators (sparse_csr_linear.h; cuSPARSE on a GPU).
//
// Which pruned form a matrix takes is its FormPolicy's: CSR from a fixed
// sparsity on (our kernels on the CPU, LibTorch's sparse CSR elsewhere), or
// (timed) whichever of masked dense, our CSR kernels (CPU only) and
// LibTorch's sparse CSR runs one forward + backward fastest on the layer's
// own device, timed when it is pruned: a pruned layer is never slower than
// its masked dense form. A CSR matrix stays in its CSR form: it only gets
// sparser.
//
// The names never change ("weight", "bias", "mask", "row_ptr", "col_idx";
// the last three only exist when `prunable`), only the shapes, and the form
// follows from the shapes alone. So a layer's state (layer_state.h) carries
// a pruned layer as it is — live migration and checkpoints restore it onto
// a fresh dense module by Tensor::set_data, no metadata needed — and the
// AdamW state of "weight" keeps its key. Pruning only ever removes weights.
//
// Not thread-safe; one rank's thread owns its layers.
#ifndef DYNMO_TRAINER_MODEL_PRUNABLE_LINEAR_H_
#define DYNMO_TRAINER_MODEL_PRUNABLE_LINEAR_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "trainer/model/csr_linear.h"
#include "trainer/model/sparse_csr_linear.h"

namespace dynmo::trainer {

class PrunableLinearImpl : public torch::nn::Module {
 public:
  enum class Form { kDense, kMasked, kCsr, kTorchCsr };
  static bool IsCsr(Form f) { return f == Form::kCsr || f == Form::kTorchCsr; }

  // Initialised like torch::nn::Linear(in, out) from the global generator.
  // `prunable` registers the mask / CSR buffers (empty while dense).
  PrunableLinearImpl(int64_t in, int64_t out, bool prunable);

  torch::Tensor forward(const torch::Tensor& x);
  // Output features [first, first + count) of forward(x). The dense and
  // masked forms multiply only those rows of W (their cost is count/out of
  // forward's); the CSR forms run forward and narrow (correct, not cheaper).
  torch::Tensor ForwardRows(const torch::Tensor& x, int64_t first, int64_t count);

  Form form() const;
  bool prunable() const { return prunable_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // Weights in the dense matrix (out · in) and stored (unpruned) ones.
  int64_t dense_size() const { return in_ * out_; }
  int64_t nnz() const;
  double sparsity() const;

  // |w| of every stored weight, 1-D float (the candidates for pruning).
  torch::Tensor StoredMagnitudes() const;

  // Seconds of one forward + backward per form; negative: not timed (or
  // not available on this device).
  struct FormTimings {
    double masked = -1;
    double csr = -1;        // our kernels
    double torch_csr = -1;  // LibTorch's sparse CSR
  };
  // How Prune picks the form of a matrix it thins out.
  struct FormPolicy {
    // CSR is considered only from this sparsity on (1: never).
    double csr_min_sparsity = 0.8;
    // false: CSR from csr_min_sparsity on. true: from there, time every
    // form this device runs (forward + backward of `probe_rows` rows, best
    // of 3 after a warm-up) and take the fastest. `agree`, when set, turns
    // this rank's timings into the ones every replica of the stage decides
    // on (the trainer sums them over the dp group), so replicas of a layer
    // always pick the same form; it is a collective.
    bool timed = false;
    int64_t probe_rows = 128;
    std::function<absl::Status(FormTimings*)> agree;
  };
  struct PruneOutcome {
    int64_t removed = 0;
    FormTimings timings;  // what the choice was made on
    bool timed() const { return timings.masked >= 0; }
  };

  // Removes every stored weight with |w| < threshold. Afterwards the layer
  // is in the form `policy` picks (still dense if nothing was removed).
  // `optimizer` owns "weight": its AdamW state follows
  // (adamw_state_select.h). The gradient of "weight" is reset.
  // FAILED_PRECONDITION unless prunable.
  absl::StatusOr<PruneOutcome> Prune(float threshold, const FormPolicy& policy,
                                     torch::optim::AdamW& optimizer);
  // Prune with CSR from `csr_min_sparsity` on, untimed; returns how many
  // weights it removed.
  absl::StatusOr<int64_t> PruneBelow(float threshold, double csr_min_sparsity,
                                     torch::optim::AdamW& optimizer);

  // W as a dense [out, in] matrix, zeros where pruned (tests, checks).
  torch::Tensor DenseWeight() const;

  torch::Tensor weight;  // [out, in] (dense, masked) or [nnz] values (csr)
  torch::Tensor bias;    // [out]

 private:
  // The kernels' matrix for the current pattern, rebuilt when stale.
  const c10::intrusive_ptr<CsrWeight>& Csr();
  // Seconds of one forward + backward of `probe_rows` rows through W ⊙ keep
  // (masked) and through each CSR form of the survivors `idx` (flat,
  // row-major) this device runs.
  FormTimings TimeForms(const torch::Tensor& keep, const torch::Tensor& idx,
                        int64_t probe_rows);
  // Sets the CSR form `form` (kCsr or kTorchCsr) from surviving values and
  // their row / column.
  void SetCsr(const torch::Tensor& values, const torch::Tensor& rows,
              const torch::Tensor& cols, Form form);

  int64_t in_;
  int64_t out_;
  bool prunable_;
  torch::Tensor mask_;     // bool [out, in] when masked, else empty
  torch::Tensor row_ptr_;  // [out + 1] when csr (int32 or int64), else empty
  torch::Tensor col_idx_;  // [nnz] when csr (same dtype), else empty
  c10::intrusive_ptr<CsrWeight> csr_;
  const void* csr_row_ptr_data_ = nullptr;  // what csr_ was built from
  const void* csr_col_idx_data_ = nullptr;
};
TORCH_MODULE(PrunableLinear);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_MODEL_PRUNABLE_LINEAR_H_
