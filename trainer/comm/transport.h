// Transport: the one seam between the pipeline and the communication
// backend, after c10d's ProcessGroup. The 1F1B stage, the gradient
// all-reduce and the per-iteration statistics call only this interface and
// never name Gloo or NCCL, so the same schedule code builds against
// LibTorch 1.13 (Debian, CPU, Gloo) and 2.x (CUDA, NCCL).
//
// Ranks are global (RANK of the job). The data-parallel group of a rank is
// the dp replicas of its pipeline stage (config.h's rank layout).
// When an operation returns, its result is ready for the caller: in CPU
// memory it has landed (the host waited); on a GPU, every later kernel on
// the current stream runs after it (stream ordering, no host wait).
// Backend exceptions become a Status (UNAVAILABLE when a peer is gone or a
// timeout expired), so a dead rank stops its neighbours with an error
// instead of a hang.
// Not thread-safe: one thread per rank drives its transport.
#ifndef DYNMO_TRAINER_COMM_TRANSPORT_H_
#define DYNMO_TRAINER_COMM_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/comm/dist_env.h"

namespace at {
class Tensor;
}  // namespace at

namespace dynmo::trainer {

// One half of a point-to-point exchange. Recv fills `tensor` in place, so it
// must already have the sender's shape and dtype.
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  at::Tensor* tensor = nullptr;
  int peer = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Posts every op as one batch, then completes it (c10d's
  // batch_isend_irecv: one coalesced group on NCCL), so a send and a
  // receive in opposite directions between the same two ranks cannot
  // deadlock. Both ranks of a pair must list their ops to each other in the
  // same order (NCCL's rule; the test double of nccl_double.h checks it).
  virtual absl::Status Exchange(absl::Span<const P2POp> ops) = 0;
  // Sums `tensor` in place over this rank's data-parallel group.
  virtual absl::Status AllReduceSumDataParallel(at::Tensor& tensor) = 0;
  // Sums `tensor` in place over every rank of the job.
  virtual absl::Status AllReduceSumWorld(at::Tensor& tensor) = 0;
  virtual absl::Status Barrier() = 0;
  // Gathers `tensor` from every rank of the job, in rank order, into `out`
  // (world_size tensors). Every rank must pass the same shape and dtype;
  // variable_all_gather.h builds variable-sized gathers on top.
  virtual absl::Status AllGatherWorld(const at::Tensor& tensor,
                                      std::vector<at::Tensor>& out) = 0;
  // "gloo" or "nccl".
  virtual std::string backend() const = 0;
  // Elastic re-packing. A collective over every rank of this transport:
  // `new_rank[r]` is rank r's rank among the survivors, or -1 when r leaves
  // (dp replicas stay adjacent, so survivors form whole dp groups). Builds
  // new groups over the survivors (a new store namespace; with NCCL, new
  // communicators: c10d's counterpart of ncclCommSplit) and waits until all
  // of them connected. Survivors get the new transport; a leaving rank gets
  // nullptr. This transport must not be used afterwards.
  virtual absl::StatusOr<std::unique_ptr<Transport>> Shrink(
      absl::Span<const int> new_rank) = 0;
  // Elastic re-shaping. A collective over every rank of this transport:
  // the same ranks, regrouped as a (world / dp) x dp grid (config.h's
  // layout: dp replicas adjacent). Builds a new generation of groups (the
  // world and the new data-parallel groups) and waits until all of them
  // connected; this transport must not be used afterwards.
  virtual absl::StatusOr<std::unique_ptr<Transport>> Reshape(int dp) = 0;
};

struct TransportOptions {
  int dp = 1;           // data-parallel degree (world = pp * dp)
  int timeout_s = 300;  // rendezvous and per-operation timeout
  // The GPU the rank computes on (NCCL's communicators live there); -1:
  // LOCAL_RANK.
  int device_index = -1;
  // ConnectGlooTransport only: every group behind nccl_double.h's test
  // double, which completes point-to-point ops as NCCL does (--backend=
  // nccl-double).
  bool nccl_double = false;
};

// Connects this rank: a c10d TCPStore at MASTER_ADDR:MASTER_PORT (served by
// rank 0), or an in-process store for a world of one, and Gloo process
// groups over the world and over this rank's data-parallel group. The Gloo
// device binds the interface named by GLOO_SOCKET_IFNAME when set, loopback
// when MASTER_ADDR is loopback, else this host's address.
absl::StatusOr<std::unique_ptr<Transport>> ConnectGlooTransport(
    const DistEnv& env, const TransportOptions& options);

// The same over NCCL on GPU LOCAL_RANK (tensors are copied to the GPU and
// back around each operation). Only in builds against a CUDA LibTorch with
// NCCL (CMake option DYNMO_WITH_NCCL); elsewhere it returns UNIMPLEMENTED.
absl::StatusOr<std::unique_ptr<Transport>> ConnectNcclTransport(
    const DistEnv& env, const TransportOptions& options);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_COMM_TRANSPORT_H_
