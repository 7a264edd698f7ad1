#include "trainer/model/prunable_linear.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "trainer/comm/device.h"
#include "trainer/model/adamw_state_select.h"

namespace dynmo::trainer {
namespace {

// CSR row pointers [out + 1] (int64) of entries whose rows, in row-major
// order, are `rows`.
torch::Tensor RowPointers(const torch::Tensor& rows, int64_t out) {
  torch::Tensor row_ptr = torch::zeros({out + 1}, rows.options().dtype(torch::kLong));
  row_ptr.narrow(0, 1, out).copy_(torch::bincount(rows, {}, out).cumsum(0));
  return row_ptr;
}

}  // namespace

PrunableLinearImpl::PrunableLinearImpl(int64_t in, int64_t out, bool prunable)
    : in_(in), out_(out), prunable_(prunable) {
  // Draw the initial values exactly as torch::nn::Linear does.
  torch::nn::Linear init(in, out);
  weight = register_parameter("weight", init->weight.detach());
  bias = register_parameter("bias", init->bias.detach());
  if (prunable_) {
    mask_ = register_buffer("mask", torch::empty({0}, torch::kBool));
    row_ptr_ = register_buffer("row_ptr", torch::empty({0}, torch::kInt));
    col_idx_ = register_buffer("col_idx", torch::empty({0}, torch::kInt));
  }
}

PrunableLinearImpl::Form PrunableLinearImpl::form() const {
  if (weight.dim() == 1) {
    return row_ptr_.scalar_type() == torch::kLong ? Form::kTorchCsr : Form::kCsr;
  }
  if (mask_.defined() && mask_.numel() > 0) return Form::kMasked;
  return Form::kDense;
}

int64_t PrunableLinearImpl::nnz() const {
  switch (form()) {
    case Form::kCsr:
    case Form::kTorchCsr:
      return weight.numel();
    case Form::kMasked:
      // host-sync(event): the non-zero count, read when the model changed (a pruning step), not
      //   per step
      return mask_.sum().item<int64_t>();
    case Form::kDense:
      break;
  }
  return dense_size();
}

double PrunableLinearImpl::sparsity() const {
  return 1.0 - static_cast<double>(nnz()) / static_cast<double>(dense_size());
}

torch::Tensor PrunableLinearImpl::StoredMagnitudes() const {
  torch::NoGradGuard no_grad;
  switch (form()) {
    case Form::kCsr:
    case Form::kTorchCsr:
      return weight.abs().contiguous();
    case Form::kMasked:
      // host-sync(event): a pruning step: the kept weights' magnitudes (read only then)
      return weight.abs().masked_select(mask_);
    case Form::kDense:
      break;
  }
  return weight.abs().reshape({-1}).contiguous();
}

const c10::intrusive_ptr<CsrWeight>& PrunableLinearImpl::Csr() {
  if (!csr_ || csr_row_ptr_data_ != row_ptr_.data_ptr() ||
      csr_col_idx_data_ != col_idx_.data_ptr() || csr_->matrix.nnz() != weight.numel()) {
    absl::StatusOr<c10::intrusive_ptr<CsrWeight>> m =
        MakeCsrWeight(out_, in_, row_ptr_, col_idx_);
    TORCH_CHECK(m.ok(), "PrunableLinear: ", m.status().ToString());
    csr_ = *std::move(m);
    csr_row_ptr_data_ = row_ptr_.data_ptr();
    csr_col_idx_data_ = col_idx_.data_ptr();
  }
  return csr_;
}

torch::Tensor PrunableLinearImpl::forward(const torch::Tensor& x) {
  switch (form()) {
    case Form::kCsr:
      return CsrLinear(x, weight, bias, Csr());
    case Form::kTorchCsr:
      return SparseCsrLinear(x, weight, bias, row_ptr_, col_idx_, out_, in_);
    case Form::kMasked:
      return torch::linear(x, weight * mask_, bias);
    case Form::kDense:
      break;
  }
  return torch::linear(x, weight, bias);
}

torch::Tensor PrunableLinearImpl::ForwardRows(const torch::Tensor& x, int64_t first,
                                              int64_t count) {
  TORCH_CHECK(first >= 0 && count >= 0 && first + count <= out_, "PrunableLinear: rows [",
              first, ", ", first + count, ") outside [0, ", out_, ")");
  switch (form()) {
    case Form::kCsr:
    case Form::kTorchCsr:
      return forward(x).narrow(-1, first, count);
    case Form::kMasked:
      return torch::linear(x, weight.narrow(0, first, count) * mask_.narrow(0, first, count),
                           bias.narrow(0, first, count));
    case Form::kDense:
      break;
  }
  return torch::linear(x, weight.narrow(0, first, count), bias.narrow(0, first, count));
}

torch::Tensor PrunableLinearImpl::DenseWeight() const {
  torch::NoGradGuard no_grad;
  switch (form()) {
    case Form::kCsr:
    case Form::kTorchCsr: {
      torch::Tensor dense = torch::zeros({out_, in_}, weight.options());
      const torch::Tensor counts = (row_ptr_.narrow(0, 1, out_) - row_ptr_.narrow(0, 0, out_))
                                       .to(torch::kLong);
      const torch::Tensor rows = torch::repeat_interleave(
          torch::arange(out_, counts.options()), counts);
      dense.index_put_({rows, col_idx_.to(torch::kLong)}, weight.detach());
      return dense;
    }
    case Form::kMasked:
      return (weight * mask_).detach().clone();
    case Form::kDense:
      break;
  }
  return weight.detach().clone();
}

void PrunableLinearImpl::SetCsr(const torch::Tensor& values, const torch::Tensor& rows,
                                const torch::Tensor& cols, Form form) {
  // The index dtype names the implementation (see the header).
  const torch::ScalarType index = form == Form::kTorchCsr ? torch::kLong : torch::kInt;
  // `rows` is non-decreasing (entries in row-major order).
  weight.set_data(values.contiguous());
  row_ptr_.set_data(RowPointers(rows, out_).to(index));
  col_idx_.set_data(cols.to(index).contiguous());
  mask_.set_data(torch::empty({0}, weight.options().dtype(torch::kBool)));
  csr_.reset();
}

absl::StatusOr<int64_t> PrunableLinearImpl::PruneBelow(float threshold,
                                                       double csr_min_sparsity,
                                                       torch::optim::AdamW& optimizer) {
  FormPolicy policy;
  policy.csr_min_sparsity = csr_min_sparsity;
  absl::StatusOr<PruneOutcome> r = Prune(threshold, policy, optimizer);
  if (!r.ok()) return r.status();
  return r->removed;
}

namespace {

// The best of three runs of `f` after one warm-up, in seconds; the device
// is synchronised around each run so the clock sees the kernels.
double BestOfThree(const std::function<void()>& f, torch::Device device) {
  f();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 3; ++i) {
    // host-sync(event): timing the three weight forms when a pruning step picks one (a benchmark
    //   of the layer)
    SynchronizeDevice(device);
    const auto start = std::chrono::steady_clock::now();
    f();
    SynchronizeDevice(device);
    best = std::min(best, std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

PrunableLinearImpl::FormTimings PrunableLinearImpl::TimeForms(const torch::Tensor& keep,
                                                              const torch::Tensor& idx,
                                                              int64_t probe_rows) {
  // Constant inputs: timing must not draw from the training RNG.
  torch::AutoGradMode grad_mode(true);
  const torch::Device device = weight.device();
  const torch::Tensor x = torch::full({probe_rows, in_}, 0.5f, weight.options());
  const torch::Tensor b = bias.detach();
  FormTimings t;
  const torch::Tensor dense = (weight.detach() * keep).requires_grad_(true);
  t.masked = BestOfThree(
      [&] {
        torch::Tensor xi = x.detach().requires_grad_(true);
        torch::linear(xi, dense, b).sum().backward();
      },
      device);
  const torch::Tensor values =
      weight.detach().reshape({-1}).index_select(0, idx).contiguous().requires_grad_(true);
  const torch::Tensor row_ptr = RowPointers(idx.div(in_, "floor"), out_);
  const torch::Tensor cols = idx.remainder(in_).contiguous();
  t.torch_csr = BestOfThree(
      [&] {
        torch::Tensor xi = x.detach().requires_grad_(true);
        SparseCsrLinear(xi, values, b, row_ptr, cols, out_, in_).sum().backward();
      },
      device);
  if (!weight.is_cuda()) {  // our kernels run on the CPU only
    absl::StatusOr<c10::intrusive_ptr<CsrWeight>> csr =
        MakeCsrWeight(out_, in_, row_ptr.to(torch::kInt), cols.to(torch::kInt));
    TORCH_CHECK(csr.ok(), "PrunableLinear: ", csr.status().ToString());
    t.csr = BestOfThree(
        [&] {
          torch::Tensor xi = x.detach().requires_grad_(true);
          CsrLinear(xi, values, b, *csr).sum().backward();
        },
        device);
  }
  return t;
}

absl::StatusOr<PrunableLinearImpl::PruneOutcome> PrunableLinearImpl::Prune(
    float threshold, const FormPolicy& policy, torch::optim::AdamW& optimizer) {
  if (!prunable_) {
    return absl::FailedPreconditionError(
        "PruneBelow on a linear layer built without pruning");
  }
  PruneOutcome outcome;
  const int64_t before = nnz();
  if (IsCsr(form())) {
    torch::NoGradGuard no_grad;
    const torch::Tensor keep = weight.abs().ge(threshold);
    // host-sync(event): a pruning step: the kept count and indices size the new CSR form
    const int64_t kept = keep.sum().item<int64_t>();
    if (kept == before) return outcome;
    const torch::Tensor idx = keep.nonzero().reshape({-1});
    const torch::Tensor counts =
        (row_ptr_.narrow(0, 1, out_) - row_ptr_.narrow(0, 0, out_)).to(torch::kLong);
    const torch::Tensor rows =
        torch::repeat_interleave(torch::arange(out_, counts.options()), counts);
    SelectAdamWState(optimizer, weight, idx);
    SetCsr(weight.index_select(0, idx), rows.index_select(0, idx),
           col_idx_.index_select(0, idx), form());
  } else {
    torch::Tensor keep;
    {
      torch::NoGradGuard no_grad;
      keep = weight.abs().ge(threshold);
      if (form() == Form::kMasked) keep.logical_and_(mask_);
    }
    // host-sync(event): a pruning step: the kept count and indices size the new weight form
    const int64_t kept = keep.sum().item<int64_t>();
    if (kept == before) return outcome;
    const double sparsity = 1.0 - static_cast<double>(kept) / static_cast<double>(dense_size());
    // Untimed, CSR means our kernels on the CPU and LibTorch's sparse CSR
    // (cuSPARSE) elsewhere; timed, the fastest form on this device.
    Form chosen = Form::kMasked;
    if (sparsity >= policy.csr_min_sparsity) {
      chosen = weight.is_cuda() ? Form::kTorchCsr : Form::kCsr;
    }
    // host-sync(event): a pruning step: the kept indices build the new form
    const torch::Tensor idx = keep.reshape({-1}).nonzero().reshape({-1});
    if (chosen != Form::kMasked && policy.timed) {
      outcome.timings = TimeForms(keep, idx, std::max<int64_t>(policy.probe_rows, 1));
      if (policy.agree) {
        if (absl::Status s = policy.agree(&outcome.timings); !s.ok()) return s;
      }
      const FormTimings& t = outcome.timings;
      chosen = Form::kMasked;
      double best = t.masked;
      if (t.csr >= 0 && t.csr < best) chosen = Form::kCsr, best = t.csr;
      if (t.torch_csr >= 0 && t.torch_csr < best) chosen = Form::kTorchCsr;
    }
    torch::NoGradGuard no_grad;
    if (chosen != Form::kMasked) {
      SelectAdamWState(optimizer, weight, idx);
      SetCsr(weight.reshape({-1}).index_select(0, idx), idx.div(in_, "floor"),
             idx.remainder(in_), chosen);
    } else {
      weight.masked_fill_(keep.logical_not(), 0);
      MaskAdamWState(optimizer, weight, keep);
      mask_.set_data(keep);
    }
  }
  weight.mutable_grad() = torch::Tensor();  // the next iteration starts fresh
  outcome.removed = before - nnz();
  return outcome;
}

}  // namespace dynmo::trainer
