// dynmo-bench-state-commit: what one commit of one job costs the
// coordinator's state dir (coordinator/service/state_store.h) as the number
// of jobs it serves grows, side by side:
//   BM_CommitOneRecord/N  a job's commit today: that job's file alone;
//   BM_WholeSnapshot/N    what every commit cost before (issue 25): the
//                         whole state — every job and the pool — as one
//                         snapshot file, written the way the old store did
//                         (temp file, fsync, rename, fsync the folder).
// Each job is a 64-stage x 8-replica record (512 ranks with host names, 64
// boundaries, 16 plans of history), ~27 KB of protobuf. Every write is
// fsync'd as in production, so the figures depend on the disk under $TMPDIR
// (docs/benchmarks.md says which one).
//
//   dynmo-bench-state-commit [--benchmark_min_time=0.5s]
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/service/state_store.h"

namespace dynmo::service {
namespace {

dynmo::v1::JobRecord ARealisticJob(int i) {
  dynmo::v1::JobRecord job;
  job.set_name(absl::StrCat("job-", i));
  job.set_pipeline_size(64);
  job.set_data_parallel_size(8);
  job.set_num_layers(128);
  job.set_owner("team-a");
  job.set_epoch(17);
  for (int b = 0; b <= 64; ++b) job.add_boundaries(2 * b);
  for (int r = 0; r < 64 * 8; ++r) {
    dynmo::v1::RankRecord* rank = job.add_ranks();
    rank->set_rank(r);
    rank->set_pipeline_rank(r % 64);
    rank->set_data_parallel_rank(r / 64);
    rank->set_host(absl::StrCat("gpu-node-", r / 8, ".cluster.example.com"));
    rank->set_device(r % 8);
    rank->set_memory_capacity_bytes(int64_t{80} << 30);
  }
  for (int h = 0; h < 16; ++h) {
    dynmo::v1::PlanRecord* plan = job.add_history();
    plan->mutable_plan()->set_epoch(h + 1);
    for (int b = 0; b <= 64; ++b) plan->mutable_plan()->add_boundaries(2 * b + (b > 0 && b < 64 ? h % 2 : 0));
  }
  for (int s = 0; s < 64; ++s) job.mutable_progress()->add_stage_load_s(0.1 + 1e-3 * s);
  return job;
}

struct Dir {
  std::string path;
  Dir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "dynmo_state_bench_XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~Dir() { std::filesystem::remove_all(path); }
};

void BM_CommitOneRecord(benchmark::State& state) {
  Dir dir;
  StateKeeper keeper(dir.path);
  if (!keeper.Open().ok()) state.SkipWithError("cannot open the state dir");
  const int jobs = static_cast<int>(state.range(0));
  for (int i = 0; i < jobs; ++i) {
    if (!keeper.CommitJob(ARealisticJob(i)).ok()) state.SkipWithError("commit failed");
  }
  dynmo::v1::JobRecord job = ARealisticJob(0);
  for (auto _ : state) {
    job.set_epoch(job.epoch() + 1);
    if (!keeper.CommitJob(job).ok()) state.SkipWithError("commit failed");
  }
  state.counters["bytes_per_commit"] = static_cast<double>(job.ByteSizeLong());
}

// The old StateStore::Save: one snapshot replaced atomically.
bool WriteSnapshot(const std::string& dir, const dynmo::v1::CoordinatorState& whole) {
  std::string data;
  if (!whole.SerializeToString(&data)) return false;
  const std::string path = dir + "/state.pb", tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) &&
            ::fsync(fd) == 0;
  ::close(fd);
  ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  ok = ok && dfd >= 0 && ::fsync(dfd) == 0;
  if (dfd >= 0) ::close(dfd);
  return ok;
}

void BM_WholeSnapshot(benchmark::State& state) {
  Dir dir;
  dynmo::v1::CoordinatorState whole;
  const int jobs = static_cast<int>(state.range(0));
  for (int i = 0; i < jobs; ++i) *whole.add_jobs() = ARealisticJob(i);
  for (auto _ : state) {
    whole.mutable_jobs(0)->set_epoch(whole.jobs(0).epoch() + 1);
    if (!WriteSnapshot(dir.path, whole)) state.SkipWithError("write failed");
  }
  state.counters["bytes_per_commit"] = static_cast<double>(whole.ByteSizeLong());
}

BENCHMARK(BM_CommitOneRecord)->Arg(1)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WholeSnapshot)->Arg(1)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dynmo::service

BENCHMARK_MAIN();
