#include "trainer/comm/process_group_transport.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "trainer/comm/p2p_batch.h"
#include "trainer/config/config.h"

namespace dynmo::trainer {

absl::Status FromException(absl::string_view what, const std::exception& e) {
  std::string msg = e.what();
  // c10 errors append a C++ backtrace after the first line; keep the message.
  if (size_t nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  return absl::UnavailableError(absl::StrCat(what, ": ", msg));
}

c10::intrusive_ptr<c10d::Store> ConnectJobStore(const DistEnv& env,
                                                std::chrono::milliseconds timeout) {
  if (env.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = env.world_size;
  store_options.waitWorkers = true;
  store_options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
}

std::string AdvertisedHost(const DistEnv& env) {
  if (env.world_size == 1 || env.master_addr == "localhost" ||
      absl::StartsWith(env.master_addr, "127.")) {
    return "127.0.0.1";
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

namespace {

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

class ProcessGroupTransport : public Transport {
 public:
  ProcessGroupTransport(std::shared_ptr<const ProcessGroupBackend> backend,
                        c10::intrusive_ptr<c10d::Store> store,
                        int store_server_rank, int rank, int world_size, int dp,
                        int generation,
                        c10::intrusive_ptr<c10d::Backend> world,
                        c10::intrusive_ptr<c10d::Backend> data_parallel)
      : backend_(std::move(backend)),
        store_(std::move(store)),
        store_server_rank_(store_server_rank),
        rank_(rank),
        world_size_(world_size),
        dp_(dp),
        generation_(generation),
        world_(std::move(world)),
        data_parallel_(std::move(data_parallel)) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return backend_->name; }

  // The batch's Works are waited on without a host timeout (stream ordering
  // on NCCL, p2p_batch.h); the host blocks only in CopyBack, where a receive
  // lands in CPU memory, and RethrowIfFailed then reports what the watchdog
  // recorded.
  absl::Status Exchange(absl::Span<const P2POp> ops) override {
    if (ops.empty()) return absl::OkStatus();
    try {
      std::vector<std::vector<at::Tensor>> buffers(ops.size());
      for (size_t i = 0; i < ops.size(); ++i) {
        buffers[i] = {ops[i].kind == P2POp::Kind::kSend ? OnDevice(*ops[i].tensor)
                                                        : RecvBuffer(*ops[i].tensor)};
      }
      const std::vector<c10::intrusive_ptr<c10d::Work>> works =
          PostPointToPoint(*world_, ops, buffers, kTag);
      WaitForBatch(works);
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].kind == P2POp::Kind::kRecv) CopyBack(buffers[i][0], *ops[i].tensor);
      }
      for (const auto& work : works) RethrowIfFailed(*work);
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

  absl::Status AllGatherWorld(const at::Tensor& tensor,
                              std::vector<at::Tensor>& out) override {
    try {
      std::vector<at::Tensor> input = {OnDevice(tensor.contiguous())};
      std::vector<std::vector<at::Tensor>> gathered(1);
      for (int r = 0; r < world_size_; ++r) gathered[0].push_back(at::empty_like(input[0]));
      c10::intrusive_ptr<c10d::Work> work = world_->allgather(gathered, input);
      work->wait();
      out.clear();
      for (at::Tensor& t : gathered[0]) out.push_back(t.to(tensor.device()));
      RethrowIfFailed(*work);
    } catch (const std::exception& e) {
      return FromException(absl::StrCat("rank ", rank_, " world all-gather"), e);
    }
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    try {
      // NCCL's barrier Work blocks the host in wait(): a barrier is one.
      c10::intrusive_ptr<c10d::Work> work = world_->barrier();
      work->wait();
      RethrowIfFailed(*work);
    } catch (const std::exception& e) {
      return FromException(absl::StrCat("rank ", rank_, " barrier"), e);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Transport>> Shrink(
      absl::Span<const int> new_rank) override {
    if (static_cast<int>(new_rank.size()) != world_size_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shrink: ", new_rank.size(), " new ranks for a world of ", world_size_));
    }
    return NextGeneration(new_rank, dp_);
  }

  absl::StatusOr<std::unique_ptr<Transport>> Reshape(int dp) override {
    std::vector<int> same(static_cast<size_t>(world_size_));
    for (int r = 0; r < world_size_; ++r) same[static_cast<size_t>(r)] = r;
    return NextGeneration(same, dp);
  }

 private:
  static constexpr int kTag = 0;

  // The groups of the next generation over the ranks `new_rank` keeps
  // (renumbered; -1 leaves), `dp` replicas per stage: Shrink keeps dp,
  // Reshape keeps every rank.
  absl::StatusOr<std::unique_ptr<Transport>> NextGeneration(
      absl::Span<const int> new_rank, int dp) {
    const int new_size = static_cast<int>(
        std::count_if(new_rank.begin(), new_rank.end(), [](int r) { return r >= 0; }));
    if (new_size == 0 || dp < 1 || new_size % dp != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "regrouping: ", new_size, " ranks is not a positive multiple of dp=", dp));
    }
    const int me = new_rank[rank_];
    const int generation = generation_ + 1;
    const std::string prefix = absl::StrCat("shrink", generation, "/");
    std::unique_ptr<Transport> next;
    try {
      c10::intrusive_ptr<c10d::Store> store = store_;
      int server = store_server_rank_ < 0 ? -1 : new_rank[store_server_rank_];
      if (store_server_rank_ >= 0 && server < 0) {
        // The store's server leaves: the new rank 0 serves a fresh store.
        const std::string key = prefix + "store";
        if (me == 0) {
          c10d::TCPStoreOptions o;
          o.port = 0;  // any free port
          o.isServer = true;
          o.waitWorkers = false;
          o.timeout = backend_->timeout;
          auto fresh = c10::make_intrusive<c10d::TCPStore>(backend_->store_host, o);
          store_->set(key, Bytes(absl::StrCat(backend_->store_host, ":",
                                              fresh->getPort())));
          store = fresh;
        } else if (me > 0) {
          store_->wait({key}, backend_->timeout);
          const std::vector<uint8_t> v = store_->get(key);
          const std::string address(v.begin(), v.end());
          const size_t colon = address.rfind(':');
          int port = 0;
          if (colon == std::string::npos ||
              !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
            return absl::InternalError(
                absl::StrCat("shrink: bad store address published: ", address));
          }
          c10d::TCPStoreOptions o;
          o.port = static_cast<uint16_t>(port);
          o.isServer = false;
          o.timeout = backend_->timeout;
          store = c10::make_intrusive<c10d::TCPStore>(address.substr(0, colon), o);
        }
        server = 0;
      }
      if (me >= 0) {
        absl::StatusOr<std::unique_ptr<Transport>> t = ConnectProcessGroups(
            backend_, store, server, me, new_size, dp, generation);
        if (!t.ok()) return t.status();
        next = *std::move(t);
      }
    } catch (const std::exception& e) {
      return FromException(absl::StrCat("rank ", rank_, " regrouping ", new_size,
                                        " ranks"),
                           e);
    }
    // Leaving ranks (and the old store) stay until every survivor connected.
    if (absl::Status s = Barrier(); !s.ok()) return s;
    return next;
  }

  // Whether `t` crosses the wire through a buffer of its own: when it
  // lives off the backend's device, and always under the NCCL double.
  bool Staged(const at::Tensor& t) const {
    return backend_->stage_always || t.device() != backend_->device;
  }
  // What a send (or a collective) hands the backend.
  at::Tensor OnDevice(const at::Tensor& t) const {
    if (!Staged(t)) return t;
    return t.device() == backend_->device ? t.clone() : t.to(backend_->device);
  }
  // Where a receive lands: the caller's tensor when it is not staged, else
  // a fresh one on the backend's device (its old contents never sent).
  at::Tensor RecvBuffer(const at::Tensor& t) const {
    return Staged(t) ? at::empty_like(t, t.options().device(backend_->device)) : t;
  }
  // After the Work's wait(): on a GPU, a copy into CPU memory is where the
  // host blocks until the result landed.
  static void CopyBack(const at::Tensor& used, at::Tensor& original) {
    if (!used.is_same(original)) original.copy_(used);
  }

  absl::Status AllReduce(c10d::Backend& group, at::Tensor& tensor,
                         absl::string_view what) {
    try {
      std::vector<at::Tensor> tensors = {OnDevice(tensor)};
      c10::intrusive_ptr<c10d::Work> work = group.allreduce(tensors);
      work->wait();
      CopyBack(tensors[0], tensor);
      RethrowIfFailed(*work);
    } catch (const std::exception& e) {
      return FromException(absl::StrCat("rank ", rank_, " ", what), e);
    }
    return absl::OkStatus();
  }

  std::shared_ptr<const ProcessGroupBackend> backend_;
  c10::intrusive_ptr<c10d::Store> store_;
  int store_server_rank_;
  int rank_;
  int world_size_;
  int dp_;
  int generation_;
  c10::intrusive_ptr<c10d::Backend> world_;
  c10::intrusive_ptr<c10d::Backend> data_parallel_;  // null when dp = 1
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> ConnectProcessGroups(
    std::shared_ptr<const ProcessGroupBackend> backend,
    c10::intrusive_ptr<c10d::Store> store, int store_server_rank, int rank,
    int world_size, int dp, int generation) {
  if (dp < 1 || world_size % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WORLD_SIZE=", world_size, " is not a multiple of --dp=", dp));
  }
  // Generation 0 keeps the names of the first release ("world", "dp_stage_s").
  const std::string prefix =
      generation == 0 ? "" : absl::StrCat("shrink", generation, "/");
  try {
    c10::intrusive_ptr<c10d::Backend> world = backend->make_group(
        c10::make_intrusive<c10d::PrefixStore>(prefix + "world", store), rank,
        world_size);
    c10::intrusive_ptr<c10d::Backend> data_parallel;
    if (dp > 1) {
      const RankPosition pos = PositionOfRank(rank, dp);
      data_parallel = backend->make_group(
          c10::make_intrusive<c10d::PrefixStore>(
              absl::StrCat(prefix, "dp_stage_", pos.stage), store),
          pos.dp_rank, dp);
    }
    return std::unique_ptr<Transport>(new ProcessGroupTransport(
        std::move(backend), std::move(store), store_server_rank, rank, world_size,
        dp, generation, std::move(world), std::move(data_parallel)));
  } catch (const std::exception& e) {
    return FromException(absl::StrCat("rank ", rank, " connecting the ",
                                      backend->name, " groups"),
                         e);
  }
}

}  // namespace dynmo::trainer
