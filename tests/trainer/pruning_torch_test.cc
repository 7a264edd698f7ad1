// Gradual global magnitude pruning, in process (trainer/model/prunable_linear.h,
// csr_linear.h, adamw_state_select.h, variable_all_gather.h,
// dynamism/global_magnitude_threshold.h, dynamism/pruning.h):
//   - the CSR autograd op equals a dense masked linear, forward and backward;
//   - PrunableLinear is nn::Linear while dense and keeps exactly the
//     surviving weights when pruned, in masked or CSR form;
//   - AdamW state is gathered with the survivors, so training the CSR layer
//     follows training the dense masked layer;
//   - the distributed threshold over several Gloo ranks equals a brute-force
//     single-process top-k over the concatenated weights;
//   - a pruned block survives the layer-state round trip of migration.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/comm/variable_all_gather.h"
#include "trainer/dynamism/global_magnitude_threshold.h"
#include "trainer/dynamism/pruning.h"
#include "trainer/model/adamw_state_select.h"
#include "trainer/model/csr_linear.h"
#include "trainer/model/prunable_linear.h"
#include "trainer/state/layer_state.h"

namespace dynmo::trainer {
namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Runs fn(rank, transport) on `world` threads, each one rank of a Gloo job.
void RunRanks(int world, const std::function<void(int, Transport&)>& fn) {
  const int port = FreePort();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      DistEnv env;
      env.rank = r;
      env.local_rank = r;
      env.world_size = world;
      env.master_port = port;
      TransportOptions options;
      options.timeout_s = 60;
      absl::StatusOr<std::unique_ptr<Transport>> t = ConnectGlooTransport(env, options);
      if (!t.ok()) {
        errors[r] = t.status().ToString();
        return;
      }
      fn(r, **t);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// |N(0, 1)| samples, a deterministic stream per seed.
torch::Tensor Magnitudes(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = std::abs(normal(rng));
  return torch::tensor(v, torch::kFloat).reshape({n});
}

// The keep-th largest of `all` (1-based), the single-process reference.
float BruteForceThreshold(const torch::Tensor& all, int64_t keep) {
  return std::get<0>(torch::topk(all, keep)).min().item<float>();
}

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

// ---- distributed threshold ----------------------------------------------

TEST(VariableAllGather, EveryRankGetsEveryRanksTensorOfItsOwnLength) {
  RunRanks(3, [](int rank, Transport& t) {
    const torch::Tensor mine = torch::arange(rank * 2, torch::kFloat) + 10 * rank;
    absl::StatusOr<std::vector<torch::Tensor>> all = AllGatherVariable(t, mine);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(all->size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(torch::equal((*all)[r], torch::arange(r * 2, torch::kFloat) + 10 * r))
          << "rank " << rank << " entry " << r;
    }
  });
}

// Rank r holds kSizes[r] magnitudes (one rank none): every rank's threshold
// equals the top-k of the concatenation computed in one process.
void ExpectThresholdsMatchBruteForce(int64_t max_candidates) {
  const std::vector<int64_t> sizes = {1000, 0, 2500};
  std::vector<torch::Tensor> parts;
  for (size_t r = 0; r < sizes.size(); ++r) parts.push_back(Magnitudes(sizes[r], 40 + r));
  const torch::Tensor all = torch::cat(parts);
  const std::vector<int64_t> keeps = {1, 10, 350, 1700, 3499};
  RunRanks(3, [&](int rank, Transport& t) {
    for (int64_t keep : keeps) {
      absl::StatusOr<GlobalThresholdResult> r =
          GlobalKeepThreshold(t, parts[rank], keep, max_candidates);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->threshold, BruteForceThreshold(all, keep)) << "keep " << keep;
      EXPECT_EQ(r->total, 3500);
      EXPECT_EQ(all.ge(r->threshold).sum().item<int64_t>(), keep);  // no ties here
    }
    absl::StatusOr<GlobalThresholdResult> everything = GlobalKeepThreshold(t, parts[rank], 3500);
    ASSERT_TRUE(everything.ok());
    EXPECT_EQ(everything->threshold, 0);
    absl::StatusOr<GlobalThresholdResult> nothing = GlobalKeepThreshold(t, parts[rank], 0);
    ASSERT_TRUE(nothing.ok());
    EXPECT_EQ(nothing->threshold, std::numeric_limits<float>::infinity());
  });
}

TEST(GlobalThreshold, EqualsBruteForceTopKOverTheConcatenatedWeightsOfThreeRanks) {
  ExpectThresholdsMatchBruteForce(int64_t{1} << 16);
}

TEST(GlobalThreshold, EqualsBruteForceWhenRefiningBucketsBeforeExchangingCandidates) {
  ExpectThresholdsMatchBruteForce(4);
}

TEST(GlobalThreshold, ExchangesOnlyTheCandidatesOfOneBucketNotTheModel) {
  RunRanks(2, [](int rank, Transport& t) {
    const torch::Tensor mine = Magnitudes(20000, 70 + rank);
    absl::StatusOr<GlobalThresholdResult> r = GlobalKeepThreshold(t, mine, 4000);
    ASSERT_TRUE(r.ok());
    EXPECT_LT(r->candidates_exchanged, 40000 / 20);
  });
}

TEST(GlobalThreshold, TiesAtTheThresholdResolveToTheTiedValue) {
  RunRanks(2, [](int rank, Transport& t) {
    // Each rank: 100 x 0.5 and 100 x 0.25; keep 150 lands inside the 0.5s.
    const torch::Tensor mine = torch::cat({torch::full({100}, 0.5f), torch::full({100}, 0.25f)});
    absl::StatusOr<GlobalThresholdResult> r = GlobalKeepThreshold(t, mine, 150, 1);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->threshold, 0.5f);
  });
}

TEST(GlobalThreshold, AnInvalidInputOnOneRankFailsEveryRank) {
  RunRanks(2, [](int rank, Transport& t) {
    const torch::Tensor mine = rank == 1 ? torch::tensor({0.1f, -1.0f}) : torch::tensor({0.3f});
    absl::StatusOr<GlobalThresholdResult> r = GlobalKeepThreshold(t, mine, 1);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  });
}

// ---- global pruning of real blocks ---------------------------------------

TrainerConfig PruningConfigFor(int blocks) {
  TrainerConfig c;
  c.model.num_blocks = blocks;
  c.model.hidden = 32;
  c.model.heads = 2;
  c.model.seq_len = 8;
  c.model.vocab = 32;
  c.model.dynamism = *ParseDynamism("pruning");
  return c;
}

// Two stages (blocks 1-2 with the embedding, blocks 3-4 with the head)
// prune to 90% together: the threshold is the brute-force one over all
// blocks' weights, and the model keeps exactly keep weights in total.
TEST(PruneGlobally, TwoStagesKeepTheGlobalTopKOfAllBlocksWeights) {
  const TrainerConfig config = PruningConfigFor(4);
  std::vector<std::vector<OwnedLayer>> stages(2);
  for (int id = 0; id < 6; ++id) stages[id < 3 ? 0 : 1].push_back(MakeOwnedLayer(config, id));
  std::vector<torch::Tensor> weights;
  for (auto& stage : stages) {
    for (OwnedLayer& owned : stage) {
      for (PrunableLinear& p : PrunableLinears(*owned.layer)) {
        weights.push_back(p->weight.detach().clone().reshape({-1}));
      }
    }
  }
  ASSERT_EQ(weights.size(), 16u);  // 4 blocks x (qkv, attention_out, mlp_in, mlp_out)
  const torch::Tensor all = torch::cat(weights).abs();
  const int64_t keep = std::llround(all.numel() * 0.1);
  const float expected = BruteForceThreshold(all, keep);

  std::vector<GlobalPruneResult> results(2);
  RunRanks(2, [&](int rank, Transport& t) {
    StageView view{config, rank, 2, 0, stages[rank], t};
    PruningConfig untimed;
    untimed.form = "threshold";
    absl::StatusOr<GlobalPruneResult> r = PruneGlobally(view, 0.9, untimed);
    ASSERT_TRUE(r.ok()) << r.status();
    results[rank] = *r;
  });
  int64_t kept = 0;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].threshold, expected);
    EXPECT_EQ(results[rank].keep, keep);
    EXPECT_TRUE(results[rank].changed);
    for (OwnedLayer& owned : stages[rank]) {
      for (PrunableLinear& p : PrunableLinears(*owned.layer)) {
        kept += p->nnz();
        if (p->sparsity() >= 0.8) {
          EXPECT_EQ(p->form(), PrunableLinearImpl::Form::kCsr);
        }
      }
    }
  }
  EXPECT_EQ(kept, keep);
  EXPECT_EQ(results[0].pruned_here + results[1].pruned_here, all.numel() - keep);
}

// One block trained a step, pruned partly to masked and partly to CSR,
// captured, encoded, decoded and restored (what migration does): the copy
// computes and trains on bit-identically, with its CSR arrays and moments.
TEST(PrunedLayerState, RestoredPrunedBlockTrainsOnBitIdentically) {
  const TrainerConfig config = PruningConfigFor(2);
  OwnedLayer original = MakeOwnedLayer(config, 1);
  auto train = [&](OwnedLayer& owned, int seed) {
    torch::manual_seed(seed);
    const torch::Tensor x = torch::randn({2, 8, 32});
    MicroBatchContext ctx;
    owned.optimizer->zero_grad();
    torch::Tensor y = owned.layer->Forward(x, ctx);
    y.pow(2).mean().backward();
    owned.optimizer->step();
    return y.detach();
  };
  train(original, 1);
  std::vector<PrunableLinear> linears = PrunableLinears(*original.layer);
  ASSERT_EQ(linears.size(), 4u);
  // qkv and mlp_in to ~90% (CSR), attention_out to ~50% (masked).
  for (int i : {0, 1, 2}) {
    const torch::Tensor m = linears[i]->StoredMagnitudes();
    const float t = i == 1 ? m.median().item<float>() : BruteForceThreshold(m, m.numel() / 10);
    ASSERT_TRUE(linears[i]->PruneBelow(t, 0.8, *original.optimizer).ok());
  }
  ASSERT_EQ(linears[0]->form(), PrunableLinearImpl::Form::kCsr);
  ASSERT_EQ(linears[1]->form(), PrunableLinearImpl::Form::kMasked);
  ASSERT_EQ(linears[3]->form(), PrunableLinearImpl::Form::kDense);
  train(original, 2);

  const torch::Tensor bytes = EncodeLayerState(CaptureLayerState(original));
  absl::StatusOr<LayerState> decoded =
      DecodeLayerState(absl::MakeConstSpan(bytes.data_ptr<uint8_t>(), bytes.numel()));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  absl::StatusOr<OwnedLayer> copy = RestoreLayer(config, *decoded);
  ASSERT_TRUE(copy.ok()) << copy.status();
  std::vector<PrunableLinear> copied = PrunableLinears(*copy->layer);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(copied[i]->form(), linears[i]->form()) << i;
    EXPECT_EQ(copied[i]->nnz(), linears[i]->nnz()) << i;
    EXPECT_TRUE(torch::equal(FindAdamWState(*copy->optimizer, copied[i]->weight)->exp_avg(),
                             FindAdamWState(*original.optimizer, linears[i]->weight)->exp_avg()))
        << i;
  }
  for (int seed = 3; seed < 6; ++seed) {
    EXPECT_TRUE(torch::equal(train(*copy, seed), train(original, seed))) << seed;
  }
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(torch::equal(copied[i]->DenseWeight(), linears[i]->DenseWeight())) << i;
  }
}

}  // namespace
}  // namespace dynmo::trainer
