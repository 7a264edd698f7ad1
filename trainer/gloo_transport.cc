// Transport over c10d process groups (Gloo on CPU). The class below talks
// only to c10d::ProcessGroup, so a CUDA build can hand it NCCL groups; only
// ConnectGlooTransport names Gloo.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "trainer/config.h"
#include "trainer/transport.h"

namespace dynmo::trainer {
namespace {

absl::Status FromException(absl::string_view what, const std::exception& e) {
  std::string msg = e.what();
  // c10 errors append a C++ backtrace after the first line; keep the message.
  if (size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  return absl::UnavailableError(absl::StrCat(what, ": ", msg));
}

class ProcessGroupTransport : public Transport {
 public:
  ProcessGroupTransport(std::string backend, int rank, int world_size,
                        c10::intrusive_ptr<c10d::ProcessGroup> world,
                        c10::intrusive_ptr<c10d::ProcessGroup> data_parallel,
                        std::chrono::milliseconds timeout)
      : backend_(std::move(backend)),
        rank_(rank),
        world_size_(world_size),
        world_(std::move(world)),
        data_parallel_(std::move(data_parallel)),
        timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return backend_; }

  absl::Status Exchange(absl::Span<const P2POp> ops) override {
    try {
      std::vector<c10::intrusive_ptr<c10d::Work>> pending;
      std::vector<std::vector<at::Tensor>> buffers(ops.size());
      for (size_t i = 0; i < ops.size(); ++i) {
        buffers[i] = {*ops[i].tensor};
        pending.push_back(ops[i].kind == P2POp::Kind::kSend
                              ? world_->send(buffers[i], ops[i].peer, kTag)
                              : world_->recv(buffers[i], ops[i].peer, kTag));
      }
      for (auto& work : pending) work->wait(timeout_);
    } catch (const std::exception& e) {
      return FromException(absl::StrCat("rank ", rank_, " point-to-point"), e);
    }
    return absl::OkStatus();
  }

  absl::Status AllReduceSumDataParallel(at::Tensor& tensor) override {
    if (!data_parallel_) return absl::OkStatus();  // dp = 1
    return AllReduce(*data_parallel_, tensor, "data-parallel all-reduce");
  }

  absl::Status AllReduceSumWorld(at::Tensor& tensor) override {
    return AllReduce(*world_, tensor, "world all-reduce");
  }

  absl::Status Barrier() override {
    try {
      world_->barrier()->wait(timeout_);
    } catch (const std::exception& e) {
      return FromException(absl::StrCat("rank ", rank_, " barrier"), e);
    }
    return absl::OkStatus();
  }

 private:
  static constexpr int kTag = 0;

  absl::Status AllReduce(c10d::ProcessGroup& group, at::Tensor& tensor,
                         absl::string_view what) {
    try {
      std::vector<at::Tensor> tensors = {tensor};
      group.allreduce(tensors)->wait(timeout_);
    } catch (const std::exception& e) {
      return FromException(absl::StrCat("rank ", rank_, " ", what), e);
    }
    return absl::OkStatus();
  }

  std::string backend_;
  int rank_;
  int world_size_;
  c10::intrusive_ptr<c10d::ProcessGroup> world_;
  c10::intrusive_ptr<c10d::ProcessGroup> data_parallel_;  // null when dp = 1
  std::chrono::milliseconds timeout_;
};

std::shared_ptr<gloo::transport::Device> GlooDevice(const DistEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (env.world_size == 1 || env.master_addr == "localhost" ||
      absl::StartsWith(env.master_addr, "127.")) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> ConnectGlooTransport(
    const DistEnv& env, const TransportOptions& options) {
  if (options.dp < 1 || env.world_size % options.dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WORLD_SIZE=", env.world_size, " is not a multiple of --dp=", options.dp));
  }
  const std::chrono::milliseconds timeout(int64_t{options.timeout_s} * 1000);
  try {
    c10::intrusive_ptr<c10d::Store> store;
    if (env.world_size == 1) {
      store = c10::make_intrusive<c10d::HashStore>();
    } else {
      c10d::TCPStoreOptions store_options;
      store_options.port = static_cast<uint16_t>(env.master_port);
      store_options.isServer = env.rank == 0;
      store_options.numWorkers = env.world_size;
      store_options.waitWorkers = true;
      store_options.timeout = timeout;
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    }
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    gloo_options->devices.push_back(GlooDevice(env));

    c10::intrusive_ptr<c10d::ProcessGroup> world =
        c10::make_intrusive<c10d::ProcessGroupGloo>(
            c10::make_intrusive<c10d::PrefixStore>("world", store), env.rank,
            env.world_size, gloo_options);
    c10::intrusive_ptr<c10d::ProcessGroup> data_parallel;
    if (options.dp > 1) {
      const RankPosition pos = PositionOfRank(env.rank, options.dp);
      data_parallel = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(
              absl::StrCat("dp_stage_", pos.stage), store),
          pos.dp_rank, options.dp, gloo_options);
    }
    return std::unique_ptr<Transport>(new ProcessGroupTransport(
        "gloo", env.rank, env.world_size, std::move(world),
        std::move(data_parallel), timeout));
  } catch (const std::exception& e) {
    return FromException(
        absl::StrCat("rank ", env.rank, " connecting to ", env.master_addr, ":",
                     env.master_port),
        e);
  }
}

}  // namespace dynmo::trainer
