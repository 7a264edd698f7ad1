// Gradual global magnitude pruning across ranks (trainer/comm/
// variable_all_gather.h, dynamism/global_magnitude_threshold.h,
// dynamism/pruning.h):
//   - the distributed threshold over several Gloo ranks equals a brute-force
//     single-process top-k over the concatenated weights;
//   - stages pruning real blocks together keep the global top-k;
//   - a pruned block survives the layer-state round trip of migration.
// The pruned layer itself (CSR op, forms, AdamW state):
// prunable_linear_torch_test.cc.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/trainer/pruning_helpers.h"
#include "trainer/comm/variable_all_gather.h"
#include "trainer/dynamism/global_magnitude_threshold.h"
#include "trainer/dynamism/pruning.h"
#include "trainer/model/adamw_state_select.h"
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
