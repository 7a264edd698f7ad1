// dynmo-bench-migration: how fast a layer migrates between two ranks, next to
// a plain Gloo send of the same number of bytes.
//
//   dynmo-bench-migration [--hidden H] [--reps N]
//
// Started without RANK it launches itself as two local ranks (torchrun's
// variables on loopback) and waits for them; rank 0 prints one JSON object:
//   {"layer_bytes":..,"payload_bytes":..,"migration_bytes_per_s":..,
//    "plain_send_bytes_per_s":..,"ratio":..,"encode_s":..,"decode_restore_s":..}
// A migration is SendLayerState -> RecvLayerState of one decoder block with
// its AdamW state (trainer/state/layer_state.h: the header, then every tensor
// sent as it is and received into a fresh tensor, restored onto a fresh
// layer), captured and restored as PipelineStage::ApplyMigration does; the
// plain send is one uint8 tensor of the same byte count (the file
// encoding's size) over the same Transport. Times are medians over --reps,
// each from a barrier to the receiver holding the data (receiver's clock).
// encode_s / decode_restore_s time the file encoding (checkpoints), which
// migration no longer uses.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/median.h"
#include "nlohmann/json.hpp"
#include "trainer/comm/device.h"
#include "trainer/comm/dist_env.h"
#include "trainer/comm/transport.h"
#include "trainer/state/layer_state.h"

using namespace dynmo::trainer;  // NOLINT: a benchmark's main

namespace {

using Clock = std::chrono::steady_clock;

using dynmo::bench::Median;

int Launch(char** argv) {
  const int port = 20000 + getpid() % 20000;
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}

int Fail(const absl::Status& s) {
  std::cerr << "dynmo-bench-migration: " << s << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int hidden = 512, reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--hidden") == 0) hidden = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  if (std::getenv("RANK") == nullptr) return Launch(argv);
  at::set_num_threads(1);
  absl::StatusOr<DistEnv> env = ReadDistEnv(ProcessEnv());
  if (!env.ok()) return Fail(env.status());
  absl::StatusOr<std::unique_ptr<Transport>> t = ConnectGlooTransport(*env, TransportOptions{1, 120});
  if (!t.ok()) return Fail(t.status());
  Transport& transport = **t;
  const int peer = 1 - env->rank;

  TrainerConfig config;
  config.model.hidden = hidden;
  config.model.heads = 8;
  config.model.seq_len = 64;
  OwnedLayer layer = MakeOwnedLayer(config, 1);
  {  // One step, so the AdamW state exists and travels.
    MicroBatchContext ctx;
    layer.layer->Forward(torch::randn({1, 8, hidden}), ctx).sum().backward();
    layer.optimizer->step();
  }
  const LayerState captured = CaptureLayerState(layer);
  const int64_t payload = captured.PayloadBytes();
  auto t0 = Clock::now();
  torch::Tensor encoded = EncodeLayerState(captured);
  const double encode_s = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  {
    absl::StatusOr<LayerState> decoded = DecodeLayerState(
        absl::MakeConstSpan(encoded.data_ptr<uint8_t>(), encoded.numel()));
    if (!decoded.ok()) return Fail(decoded.status());
    if (absl::StatusOr<OwnedLayer> r = RestoreLayer(config, *decoded); !r.ok()) {
      return Fail(r.status());
    }
  }
  const double decode_restore_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const int64_t bytes = encoded.numel();

  std::vector<double> migration, plain;
  torch::Tensor buffer = torch::empty({bytes}, torch::kByte);
  for (int rep = 0; rep < reps; ++rep) {
    if (absl::Status s = transport.Barrier(); !s.ok()) return Fail(s);
    t0 = Clock::now();
    if (env->rank == 0) {
      if (absl::Status s = SendLayerState(transport, CaptureLayerState(layer), peer);
          !s.ok()) {
        return Fail(s);
      }
    } else {
      absl::StatusOr<LayerState> state = RecvLayerState(transport, 1, peer, DeviceOf(config));
      if (!state.ok()) return Fail(state.status());
      absl::StatusOr<OwnedLayer> got = RestoreLayer(config, *state);
      if (!got.ok()) return Fail(got.status());
    }
    migration.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (absl::Status s = transport.Barrier(); !s.ok()) return Fail(s);
    t0 = Clock::now();
    P2POp op{env->rank == 0 ? P2POp::Kind::kSend : P2POp::Kind::kRecv, &buffer, peer};
    if (absl::Status s = transport.Exchange({op}); !s.ok()) return Fail(s);
    plain.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  // The receiver's times, reported by rank 0.
  torch::Tensor times = torch::zeros({2}, torch::kDouble);
  if (env->rank == 1) {
    times[0] = Median(migration);
    times[1] = Median(plain);
  }
  if (absl::Status s = transport.AllReduceSumWorld(times); !s.ok()) return Fail(s);
  if (env->rank == 0) {
    const double m = times[0].item<double>(), p = times[1].item<double>();
    nlohmann::json j;
    j["hidden"] = hidden;
    j["layer_bytes"] = bytes;
    j["payload_bytes"] = payload;
    j["reps"] = reps;
    j["migration_s"] = m;
    j["plain_send_s"] = p;
    j["migration_bytes_per_s"] = bytes / m;
    j["plain_send_bytes_per_s"] = bytes / p;
    j["ratio"] = p / m;
    j["encode_s"] = encode_s;
    j["decode_restore_s"] = decode_restore_s;
    std::cout << j.dump() << std::endl;
  }
  return transport.Barrier().ok() ? 0 : 1;
}
