// Gradual global magnitude pruning, the layer in one process
// (trainer/model/prunable_linear.h, csr_linear.h, adamw_state_select.h):
//   - the CSR autograd op equals a dense masked linear, forward and backward;
//   - PrunableLinear is nn::Linear while dense and keeps exactly the
//     surviving weights when pruned, in masked or CSR form;
//   - AdamW state is gathered with the survivors, so training the CSR layer
//     follows training the dense masked layer.
// The threshold across ranks and whole pruned blocks: pruning_torch_test.cc.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tests/trainer/pruning_helpers.h"
#include "trainer/model/adamw_state_select.h"
#include "trainer/model/csr_linear.h"
#include "trainer/model/prunable_linear.h"

namespace dynmo::trainer {
namespace {

// ---- the CSR autograd op ------------------------------------------------

struct CsrArrays {
  torch::Tensor row_ptr, col_idx;
};
CsrArrays ArraysOf(const torch::Tensor& mask) {
  const int64_t rows = mask.size(0), cols = mask.size(1);
  const torch::Tensor idx = mask.reshape({-1}).nonzero().reshape({-1});
  torch::Tensor row_ptr = torch::zeros({rows + 1}, torch::kLong);
  row_ptr.narrow(0, 1, rows).copy_(mask.sum(1).cumsum(0));
  return {row_ptr.to(torch::kInt), idx.remainder(cols).to(torch::kInt)};
}

void ExpectCsrMatchesDenseMasked(const torch::Tensor& mask) {
  torch::manual_seed(11);
  const int64_t out = mask.size(0), in = mask.size(1);
  const torch::Tensor w = torch::randn({out, in});
  const torch::Tensor b = torch::randn({out});
  const torch::Tensor x0 = torch::randn({3, 5, in});
  const torch::Tensor g = torch::randn({3, 5, out});

  torch::Tensor wd = (w * mask).requires_grad_(true);
  torch::Tensor bd = b.clone().requires_grad_(true);
  torch::Tensor xd = x0.clone().requires_grad_(true);
  torch::Tensor yd = torch::linear(xd, wd, bd);
  (yd * g).sum().backward();

  const CsrArrays a = ArraysOf(mask);
  absl::StatusOr<c10::intrusive_ptr<CsrWeight>> csr = MakeCsrWeight(out, in, a.row_ptr, a.col_idx);
  ASSERT_TRUE(csr.ok()) << csr.status();
  torch::Tensor values = w.masked_select(mask).requires_grad_(true);
  torch::Tensor bs = b.clone().requires_grad_(true);
  torch::Tensor xs = x0.clone().requires_grad_(true);
  torch::Tensor ys = CsrLinear(xs, values, bs, *csr);
  (ys * g).sum().backward();

  ASSERT_EQ(ys.sizes(), yd.sizes());
  EXPECT_TRUE(torch::allclose(ys, yd, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(xs.grad(), xd.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(values.grad(), wd.grad().masked_select(mask), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(bs.grad(), bd.grad(), 1e-5, 1e-5));
}

TEST(CsrLinear, ForwardAndBackwardEqualDenseMaskedLinearAt90PercentSparsity) {
  torch::manual_seed(3);
  ExpectCsrMatchesDenseMasked(torch::rand({48, 40}) > 0.9);
}

TEST(CsrLinear, ForwardAndBackwardEqualDenseMaskedLinearAt50PercentSparsity) {
  torch::manual_seed(4);
  ExpectCsrMatchesDenseMasked(torch::rand({24, 72}) > 0.5);
}

TEST(CsrLinear, FullyPrunedMatrixOutputsTheBiasAndNoInputGradient) {
  ExpectCsrMatchesDenseMasked(torch::zeros({8, 16}, torch::kBool));
}

TEST(CsrLinear, MalformedStructureIsRejected) {
  const torch::Tensor row_ptr = torch::tensor({0, 2, 1}, torch::kInt);  // decreasing
  const torch::Tensor col_idx = torch::tensor({0, 1}, torch::kInt);
  EXPECT_FALSE(MakeCsrWeight(2, 4, row_ptr, col_idx).ok());
}

// ---- PrunableLinear -----------------------------------------------------

TEST(PrunableLinear, DenseFormIsTorchLinearBitForBit) {
  torch::manual_seed(7);
  torch::nn::Linear reference(40, 48);
  torch::manual_seed(7);
  PrunableLinear p(40, 48, /*prunable=*/true);
  EXPECT_TRUE(torch::equal(p->weight, reference->weight));
  EXPECT_TRUE(torch::equal(p->bias, reference->bias));
  const torch::Tensor x = torch::randn({4, 40});
  EXPECT_TRUE(torch::equal(p(x), reference(x)));
  EXPECT_EQ(p->form(), PrunableLinearImpl::Form::kDense);
  EXPECT_EQ(p->sparsity(), 0);
}

TEST(PrunableLinear, NotPrunableHasOnlyLinearsTensorsAndRefusesToPrune) {
  PrunableLinear p(8, 8, /*prunable=*/false);
  EXPECT_EQ(p->named_buffers().size(), 0u);
  EXPECT_EQ(p->named_parameters().size(), 2u);
  torch::optim::AdamW opt(p->parameters());
  EXPECT_FALSE(p->PruneBelow(0.1f, 0.8, opt).ok());
}

TEST(PrunableLinear, PruningKeepsExactlyTheWeightsAtOrAboveTheThreshold) {
  torch::manual_seed(5);
  PrunableLinear p(64, 32, true);
  torch::optim::AdamW opt(p->parameters());
  const torch::Tensor w0 = p->weight.detach().clone();
  const torch::Tensor x = torch::randn({6, 64});

  // Half pruned: below csr_min_sparsity, so dense with a mask.
  const float t1 = p->StoredMagnitudes().median().item<float>();
  ASSERT_TRUE(p->PruneBelow(t1, 0.8, opt).ok());
  const torch::Tensor keep1 = w0.abs() >= t1;
  EXPECT_EQ(p->form(), PrunableLinearImpl::Form::kMasked);
  EXPECT_EQ(p->nnz(), keep1.sum().item<int64_t>());
  EXPECT_TRUE(torch::equal(p->DenseWeight(), w0 * keep1));
  EXPECT_TRUE(torch::allclose(p(x), torch::linear(x, w0 * keep1, p->bias), 1e-6, 1e-6));

  // 90% pruned: CSR.
  const float t2 = BruteForceThreshold(w0.abs().reshape({-1}), 64 * 32 / 10);
  absl::StatusOr<int64_t> removed = p->PruneBelow(t2, 0.8, opt);
  ASSERT_TRUE(removed.ok());
  const torch::Tensor keep2 = w0.abs() >= t2;
  EXPECT_EQ(*removed, keep1.sum().item<int64_t>() - keep2.sum().item<int64_t>());
  EXPECT_EQ(p->form(), PrunableLinearImpl::Form::kCsr);
  EXPECT_EQ(p->weight.dim(), 1);
  EXPECT_EQ(p->nnz(), 64 * 32 / 10);
  EXPECT_NEAR(p->sparsity(), 0.9, 1e-3);
  EXPECT_TRUE(torch::equal(p->DenseWeight(), w0 * keep2));
  EXPECT_TRUE(torch::allclose(p(x), torch::linear(x, w0 * keep2, p->bias), 1e-5, 1e-6));

  // Pruning again below the same threshold removes nothing.
  removed = p->PruneBelow(t2, 0.8, opt);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, 0);
}

// Early exit computes a block's queries for the tokens in flight only: the
// q rows of the qkv projection. In every form, those rows are forward's.
TEST(PrunableLinear, ForwardRowsIsTheNarrowedForwardInEveryForm) {
  torch::manual_seed(9);
  PrunableLinear p(32, 48, true);
  torch::optim::AdamW opt(p->parameters());
  const torch::Tensor x = torch::randn({5, 32});
  auto check = [&](const char* form) {
    const torch::Tensor xa = x.clone().requires_grad_(true);
    const torch::Tensor xb = x.clone().requires_grad_(true);
    const torch::Tensor rows = p->ForwardRows(xa, 16, 24);
    const torch::Tensor narrowed = p(xb).narrow(1, 16, 24);
    EXPECT_TRUE(torch::allclose(rows, narrowed, 1e-5, 1e-6)) << form;
    rows.sum().backward();
    narrowed.sum().backward();
    EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-5, 1e-6)) << form;
  };
  check("dense");
  ASSERT_TRUE(p->PruneBelow(p->StoredMagnitudes().median().item<float>(), 0.8, opt).ok());
  ASSERT_EQ(p->form(), PrunableLinearImpl::Form::kMasked);
  check("masked");
  ASSERT_TRUE(p->PruneBelow(BruteForceThreshold(p->StoredMagnitudes(), 32 * 48 / 10), 0.8, opt)
                  .ok());
  ASSERT_EQ(p->form(), PrunableLinearImpl::Form::kCsr);
  check("csr");
}

// The timed policy times every form and takes the fastest by the timings
// `agree` hands back; the test decides those, so no clock decides it. The
// layer computes the same function in each form.
TEST(PrunableLinear, TimedFormFollowsTheAgreedTimingsAndKeepsTheFunction) {
  using Form = PrunableLinearImpl::Form;
  for (Form fastest : {Form::kMasked, Form::kCsr, Form::kTorchCsr}) {
    torch::manual_seed(6);
    PrunableLinear p(64, 32, true);
    torch::optim::AdamW opt(p->parameters());
    const torch::Tensor w0 = p->weight.detach().clone();
    const torch::Tensor x = torch::randn({6, 64});
    PrunableLinearImpl::FormPolicy policy;
    policy.timed = true;
    policy.probe_rows = 16;
    int calls = 0;
    PrunableLinearImpl::FormTimings seen;
    policy.agree = [&](PrunableLinearImpl::FormTimings* t) {
      ++calls;
      seen = *t;
      t->masked = fastest == Form::kMasked ? 1.0 : 2.0;
      t->csr = fastest == Form::kCsr ? 1.0 : 3.0;
      t->torch_csr = fastest == Form::kTorchCsr ? 1.0 : 4.0;
      return absl::OkStatus();
    };
    const float t = BruteForceThreshold(w0.abs().reshape({-1}), 64 * 32 / 10);
    absl::StatusOr<PrunableLinearImpl::PruneOutcome> r = p->Prune(t, policy, opt);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(calls, 1);
    EXPECT_GT(seen.masked, 0) << "every CPU form was really run";
    EXPECT_GT(seen.csr, 0);
    EXPECT_GT(seen.torch_csr, 0);
    EXPECT_TRUE(r->timed());
    EXPECT_EQ(p->form(), fastest);
    const torch::Tensor keep = w0.abs() >= t;
    EXPECT_EQ(r->removed, 64 * 32 - keep.sum().item<int64_t>());
    EXPECT_TRUE(torch::equal(p->DenseWeight(), w0 * keep));
    EXPECT_TRUE(torch::allclose(p(x), torch::linear(x, w0 * keep, p->bias), 1e-5, 1e-6));
  }
}

// LibTorch's sparse CSR form trains like the masked dense one: the same
// gradients for the surviving weights, the input and the bias; pruning it
// further keeps that form.
TEST(PrunableLinear, LibTorchSparseCsrFormMatchesMaskedDenseGradients) {
  using Form = PrunableLinearImpl::Form;
  torch::manual_seed(8);
  PrunableLinear p(48, 40, true);
  torch::optim::AdamW opt(p->parameters());
  const torch::Tensor w0 = p->weight.detach().clone();
  PrunableLinearImpl::FormPolicy policy;
  policy.timed = true;
  policy.agree = [](PrunableLinearImpl::FormTimings* t) {
    t->torch_csr = 0;  // fastest by decree
    return absl::OkStatus();
  };
  const float t = BruteForceThreshold(w0.abs().reshape({-1}), 48 * 40 / 8);
  ASSERT_TRUE(p->Prune(t, policy, opt).ok());
  ASSERT_EQ(p->form(), Form::kTorchCsr);
  const torch::Tensor keep = w0.abs() >= t;
  const torch::Tensor x = torch::randn({3, 5, 48}).requires_grad_(true);
  const torch::Tensor xr = x.detach().clone().requires_grad_(true);
  const torch::Tensor wr = (w0 * keep).requires_grad_(true);
  const torch::Tensor br = p->bias.detach().clone().requires_grad_(true);
  const torch::Tensor g = torch::randn({3, 5, 40});
  (p(x) * g).sum().backward();
  (torch::linear(xr, wr, br) * g).sum().backward();
  EXPECT_TRUE(torch::allclose(x.grad(), xr.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(p->bias.grad(), br.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(p->weight.grad(), wr.grad().masked_select(keep), 1e-5, 1e-6));
  p->weight.mutable_grad() = torch::Tensor();
  p->bias.mutable_grad() = torch::Tensor();
  const float t2 = BruteForceThreshold(w0.abs().reshape({-1}), 48 * 40 / 16);
  ASSERT_TRUE(p->Prune(t2, policy, opt).ok());
  EXPECT_EQ(p->form(), Form::kTorchCsr);
  EXPECT_TRUE(torch::equal(p->DenseWeight(), w0 * (w0.abs() >= t2)));
}

TEST(PrunableLinear, BelowTheCsrFloorNothingIsTimed) {
  PrunableLinear p(16, 16, true);
  torch::optim::AdamW opt(p->parameters());
  PrunableLinearImpl::FormPolicy policy;
  policy.timed = true;
  policy.agree = [](PrunableLinearImpl::FormTimings*) {
    ADD_FAILURE() << "timed below csr_min_sparsity";
    return absl::OkStatus();
  };
  const float median = p->StoredMagnitudes().median().item<float>();
  absl::StatusOr<PrunableLinearImpl::PruneOutcome> r = p->Prune(median, policy, opt);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->timed());
  EXPECT_EQ(p->form(), PrunableLinearImpl::Form::kMasked);
}

// ---- AdamW state ---------------------------------------------------------

TEST(AdamWStateSelect, SelectGathersTheSurvivorsMomentsInIndexOrder) {
  torch::Tensor p = torch::randn({3, 4}).requires_grad_(true);
  torch::optim::AdamW opt(std::vector<torch::Tensor>{p}, torch::optim::AdamWOptions(0.01));
  EXPECT_FALSE(SelectAdamWState(opt, p, torch::tensor({0}, torch::kLong)));  // no state yet
  (p * torch::arange(12, torch::kFloat).reshape({3, 4})).sum().backward();
  opt.step();
  const auto* s = FindAdamWState(opt, p);
  ASSERT_NE(s, nullptr);
  const torch::Tensor avg = s->exp_avg().clone(), sq = s->exp_avg_sq().clone();
  const torch::Tensor idx = torch::tensor({1, 5, 11}, torch::kLong);
  ASSERT_TRUE(SelectAdamWState(opt, p, idx));
  s = FindAdamWState(opt, p);
  EXPECT_TRUE(torch::equal(s->exp_avg(), avg.reshape({-1}).index_select(0, idx)));
  EXPECT_TRUE(torch::equal(s->exp_avg_sq(), sq.reshape({-1}).index_select(0, idx)));
  EXPECT_EQ(s->step(), 1);
}

TEST(AdamWStateSelect, MaskZeroesThePrunedMoments) {
  torch::Tensor p = torch::randn({2, 3}).requires_grad_(true);
  torch::optim::AdamW opt(std::vector<torch::Tensor>{p}, torch::optim::AdamWOptions(0.01));
  p.sum().backward();
  opt.step();
  const torch::Tensor keep = torch::tensor({true, false, true, false, true, true}).reshape({2, 3});
  ASSERT_TRUE(MaskAdamWState(opt, p, keep));
  const auto* s = FindAdamWState(opt, p);
  EXPECT_EQ(s->exp_avg().masked_select(keep.logical_not()).abs().sum().item<float>(), 0);
  EXPECT_EQ(s->exp_avg_sq().masked_select(keep.logical_not()).abs().sum().item<float>(), 0);
  EXPECT_GT(s->exp_avg().masked_select(keep).abs().min().item<float>(), 0);
}

// Trains A (PrunableLinear, pruned to CSR after 3 steps) and B (a dense
// weight with a fixed mask and its moments masked, the textbook masked
// training) on the same data: A's weights and moments follow B's.
TEST(AdamWStateSelect, TrainingTheCsrLayerFollowsDenseMaskedTraining) {
  torch::manual_seed(9);
  PrunableLinear a(32, 24, true);
  torch::optim::AdamW opt_a(a->parameters(), torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  torch::Tensor wb = a->weight.detach().clone().requires_grad_(true);
  torch::Tensor bb = a->bias.detach().clone().requires_grad_(true);
  torch::optim::AdamW opt_b(std::vector<torch::Tensor>{wb, bb},
                            torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  torch::Tensor mask = torch::ones({24, 32}, torch::kBool);
  auto step = [&](int i) {
    torch::manual_seed(100 + i);
    const torch::Tensor x = torch::randn({8, 32}), target = torch::randn({8, 24});
    opt_a.zero_grad();
    (a(x) - target).pow(2).mean().backward();
    opt_a.step();
    opt_b.zero_grad();
    (torch::linear(x, wb * mask, bb) - target).pow(2).mean().backward();
    opt_b.step();
  };
  for (int i = 0; i < 3; ++i) step(i);
  ASSERT_TRUE(torch::allclose(a->weight, wb, 1e-6, 1e-6));

  const float t = BruteForceThreshold(wb.detach().abs().reshape({-1}), 24 * 32 / 10);
  const torch::Tensor avg_before = FindAdamWState(opt_b, wb)->exp_avg().clone();
  ASSERT_TRUE(a->PruneBelow(t, 0.8, opt_a).ok());
  ASSERT_EQ(a->form(), PrunableLinearImpl::Form::kCsr);
  {
    torch::NoGradGuard no_grad;
    mask = wb.abs() >= t;
    wb.mul_(mask);
    MaskAdamWState(opt_b, wb, mask);
  }
  // The gather right after pruning: each survivor keeps its own moments.
  EXPECT_TRUE(torch::equal(FindAdamWState(opt_a, a->weight)->exp_avg(),
                           avg_before.masked_select(mask)));

  for (int i = 3; i < 8; ++i) step(i);
  EXPECT_TRUE(torch::allclose(a->DenseWeight(), (wb * mask).detach(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(FindAdamWState(opt_a, a->weight)->exp_avg_sq(),
                              FindAdamWState(opt_b, wb)->exp_avg_sq().masked_select(mask),
                              1e-4, 1e-9));
  EXPECT_EQ(a->nnz(), mask.sum().item<int64_t>());  // nothing grew back
}

}  // namespace
}  // namespace dynmo::trainer
