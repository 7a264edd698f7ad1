// dynmo-train's runtime flags: devices, clocks, logs, traces, checkpoints,
// memory.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainer/run/train_flags.h"

ABSL_FLAG(std::string, log_json, "", "write one JSON record per iteration to this file");
ABSL_FLAG(int, log_interval, 1, "iterations per progress line");
ABSL_FLAG(int, intra_op_threads, 1, "LibTorch intra-op threads per rank");
ABSL_FLAG(std::string, backend, "gloo",
          "c10d backend: gloo (CPU), nccl (needs a CUDA LibTorch build with NCCL), "
          "or nccl-double (Gloo behind a CPU test double that completes "
          "point-to-point ops as NCCL does)");
ABSL_FLAG(std::string, device, "auto",
          "where layers compute: auto (cuda when a GPU is visible, else cpu), cpu, "
          "cuda (cuda:LOCAL_RANK) or cuda:N");
ABSL_FLAG(std::string, layer_clock, "wall",
          "what per-layer times measure on cpu: wall (steady clock) or cpu (CPU time "
          "of the computing thread; robust when ranks share cores)");
ABSL_FLAG(int, speed_probe_every, 5,
          "iterations between speed probes while the rank is watched (its first "
          "probes, and when its layers' time moves; each of its first five "
          "iterations probes): a fixed kernel timed like the layers, which tells the "
          "coordinator a slow rank from a heavy layer (0: never)");
ABSL_FLAG(int, speed_probe_steady_every, 25,
          "iterations between speed probes while the rank's pace holds steady "
          "(>= --speed_probe_every)");
ABSL_FLAG(int, timeout_s, 300, "rendezvous and communication timeout, seconds");
ABSL_FLAG(std::string, save_dir, "",
          "write per-layer checkpoints under DIR/iter_<k>/ (layer_<id>.state + manifest.json)");
ABSL_FLAG(int, save_every, 0,
          "checkpoint every N iterations (0: only after the last; needs --save_dir)");
ABSL_FLAG(std::string, load_dir, "",
          "resume from the newest complete checkpoint under DIR (any --pp/--dp)");
ABSL_FLAG(double, memory_capacity_gb, 0,
          "memory capacity per rank reported to the coordinator, GiB "
          "(0: physical memory / ranks on this host)");
ABSL_FLAG(std::string, trace, "",
          "rank 0 writes every iteration's per-layer profile to FILE "
          "(JSON Lines, what dynmo-sim --trace replays)");
ABSL_FLAG(std::string, perfetto_out, "",
          "every rank writes its real schedule over --perfetto_iterations iterations "
          "from --perfetto_first to DIR/rank<R>_trace.json (chrome trace: Perfetto)");
ABSL_FLAG(int64_t, perfetto_first, 2, "first iteration --perfetto_out records");
ABSL_FLAG(int64_t, perfetto_iterations, 4, "iterations --perfetto_out records (1..1000)");
ABSL_FLAG(bool, profile_layers, true,
          "clock every layer's forward and backward (false: one clock per stage pass)");

namespace dynmo::trainer {

absl::Status ReadRuntimeFlags(TrainerConfig& c) {
  c.log_json = absl::GetFlag(FLAGS_log_json);
  c.log_interval = absl::GetFlag(FLAGS_log_interval);
  c.intra_op_threads = absl::GetFlag(FLAGS_intra_op_threads);
  c.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  c.backend = absl::GetFlag(FLAGS_backend);
  c.device = absl::GetFlag(FLAGS_device);
  c.layer_clock = absl::GetFlag(FLAGS_layer_clock);
  c.speed_probe_every = absl::GetFlag(FLAGS_speed_probe_every);
  c.speed_probe_steady_every = absl::GetFlag(FLAGS_speed_probe_steady_every);
  c.perfetto_out = absl::GetFlag(FLAGS_perfetto_out);
  c.perfetto_first = absl::GetFlag(FLAGS_perfetto_first);
  c.perfetto_iterations = absl::GetFlag(FLAGS_perfetto_iterations);
  struct stat dir;
  if (!c.perfetto_out.empty() && (stat(c.perfetto_out.c_str(), &dir) != 0 ||
                                  !S_ISDIR(dir.st_mode) ||
                                  access(c.perfetto_out.c_str(), W_OK) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--perfetto_out: cannot write ", c.perfetto_out, "/ (not a writable directory)"));
  }
  if (c.perfetto_first < 0 || c.perfetto_iterations < 1 || c.perfetto_iterations > 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--perfetto_first must be >= 0 and --perfetto_iterations in [1, 1000], got ",
        c.perfetto_first, " and ", c.perfetto_iterations));
  }
  if (c.speed_probe_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speed_probe_every must be >= 0 (0: never), got ", c.speed_probe_every));
  }
  if (c.speed_probe_every > 0 && c.speed_probe_steady_every < c.speed_probe_every) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speed_probe_steady_every must be >= --speed_probe_every (", c.speed_probe_every,
        "), got ", c.speed_probe_steady_every));
  }
  c.save_dir = absl::GetFlag(FLAGS_save_dir);
  c.save_every = absl::GetFlag(FLAGS_save_every);
  c.load_dir = absl::GetFlag(FLAGS_load_dir);
  c.memory_capacity_bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_memory_capacity_gb) * (1LL << 30));
  c.trace = absl::GetFlag(FLAGS_trace);
  c.profile_layers = absl::GetFlag(FLAGS_profile_layers);
  return absl::OkStatus();
}

}  // namespace dynmo::trainer
