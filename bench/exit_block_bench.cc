// dynmo-bench-exit-block: what early exit saves in one decoder block. Times
// one forward + backward of a block (trainer/model/decoder_block.h) with every
// token in flight (the dense path, as a block before any exit point runs)
// and with a fraction of each sequence's tokens in flight (CALM's recipe,
// trainer/model/early_exit.h: keys and values of every token, the rest
// for the tokens in flight only).
//
//   dynmo-bench-exit-block [--hidden 512,1024] [--heads 8] [--seq_len 256]
//                          [--micro_batch 4] [--active 0.25] [--reps 9]
//                          [--threads 1]   # 0: LibTorch's default
//
// Prints one JSON object per hidden size:
//   {"hidden":..,"full_s":..,"all_active_s":..,"active_s":..,"ratio":..}
// full_s: no mask (dense path); all_active_s: a mask with every token in
// flight (the gathered path's overhead at n = B·T); active_s: the fraction
// in flight, exactly round(active·T) tokens per sequence at random positions
// (seeded); ratio = active_s / full_s. Times are medians over --reps after
// two warm-up runs; the backward reaches the block's input, as in a stage.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/median.h"
#include "trainer/model/decoder_block.h"
#include "trainer/model/gpt_layers.h"
#include "trainer/model/make_layer.h"

using namespace dynmo::trainer;  // NOLINT: a benchmark's main

namespace {

using Clock = std::chrono::steady_clock;

using dynmo::bench::Median;

// Median seconds of one forward + backward of `block` on x under `active`
// (undefined: every token in flight).
double TimeBlock(PipelineLayer& block, const torch::Tensor& x, const torch::Tensor& grad,
                 const torch::Tensor& active, int reps) {
  std::vector<double> times;
  for (int r = 0; r < reps + 2; ++r) {
    for (torch::Tensor& p : block.parameters()) p.mutable_grad() = torch::Tensor();
    torch::Tensor input = x.detach().requires_grad_(true);
    MicroBatchContext ctx;
    ctx.token_active = active;
    const auto start = Clock::now();
    block.Forward(input, ctx).backward(grad);
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    if (r >= 2) times.push_back(s);
  }
  return Median(times);
}

// Exactly round(fraction·T) tokens of each sequence, at random positions.
torch::Tensor SpreadMask(int64_t b, int64_t t, double fraction) {
  const int64_t keep = std::max<int64_t>(1, static_cast<int64_t>(fraction * t + 0.5));
  torch::Tensor mask = torch::zeros({b, t}, torch::kBool);
  for (int64_t i = 0; i < b; ++i) mask[i].index_fill_(0, torch::randperm(t).narrow(0, 0, keep), true);
  return mask;
}

int Usage(const std::string& why) {
  std::cerr << "dynmo-bench-exit-block: " << why << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> hiddens = {512, 1024};
  int heads = 8, seq_len = 256, micro_batch = 4, reps = 9, threads = 1;
  double active = 0.25;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) return Usage(std::string("missing value for ") + argv[i]);
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--hidden") {
      hiddens.clear();
      for (absl::string_view h : absl::StrSplit(value, ',')) {
        int parsed = 0;
        ok = ok && absl::SimpleAtoi(h, &parsed) && parsed > 0;
        hiddens.push_back(parsed);
      }
    } else if (flag == "--heads") {
      ok = absl::SimpleAtoi(value, &heads) && heads > 0;
    } else if (flag == "--seq_len") {
      ok = absl::SimpleAtoi(value, &seq_len) && seq_len > 0;
    } else if (flag == "--micro_batch") {
      ok = absl::SimpleAtoi(value, &micro_batch) && micro_batch > 0;
    } else if (flag == "--active") {
      ok = absl::SimpleAtod(value, &active) && active > 0 && active <= 1;
    } else if (flag == "--reps") {
      ok = absl::SimpleAtoi(value, &reps) && reps > 0;
    } else if (flag == "--threads") {
      ok = absl::SimpleAtoi(value, &threads) && threads >= 0;
    } else {
      return Usage("unknown flag " + flag);
    }
    if (!ok) return Usage("bad value '" + value + "' for " + flag);
  }
  if (threads > 0) at::set_num_threads(threads);
  for (int hidden : hiddens) {
    if (hidden % heads != 0) return Usage("--hidden must be a multiple of --heads");
    ModelConfig m;
    m.hidden = hidden;
    m.heads = heads;
    m.seq_len = seq_len;
    m.num_blocks = 2;
    std::shared_ptr<PipelineLayer> block = MakeLayer(m, 1, /*seed=*/1);
    torch::manual_seed(2);
    const torch::Tensor x = torch::randn({micro_batch, seq_len, hidden});
    const torch::Tensor grad = torch::randn({micro_batch, seq_len, hidden});
    const torch::Tensor some = SpreadMask(micro_batch, seq_len, active);
    const torch::Tensor all = torch::ones({micro_batch, seq_len}, torch::kBool);
    const double full_s = TimeBlock(*block, x, grad, torch::Tensor(), reps);
    const double all_active_s = TimeBlock(*block, x, grad, all, reps);
    const double active_s = TimeBlock(*block, x, grad, some, reps);
    std::cout << "{\"hidden\":" << hidden << ",\"heads\":" << heads
              << ",\"seq_len\":" << seq_len << ",\"micro_batch\":" << micro_batch
              << ",\"active\":" << active << ",\"threads\":" << at::get_num_threads()
              << ",\"full_s\":" << full_s << ",\"all_active_s\":" << all_active_s
              << ",\"active_s\":" << active_s << ",\"ratio\":" << active_s / full_s << "}"
              << std::endl;
  }
  return 0;
}
