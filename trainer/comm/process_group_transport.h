// The Transport over c10d backends, backend-neutral: it talks only to
// c10d::Backend (what ProcessGroupGloo / ProcessGroupNCCL derive from in
// PyTorch 2.x) and c10d::Store, and takes the backend as a factory, so
// Gloo (gloo_transport.cc) and NCCL (nccl_transport.cc, CUDA builds only)
// share the schedule-facing code and the elastic shrink.
//
// Completion, on every backend: point-to-point batches follow c10d's
// coalescing semantics (p2p_batch.h); every Work is waited on without a host
// timeout (on NCCL that orders the current stream after the communication
// and the host does not block); the host blocks only where a result lands
// in CPU memory. A dead or timed-out peer reaches the caller as UNAVAILABLE:
// c10d throws c10::DistBackendError (NCCL: once the watchdog aborted the
// communicator, see nccl_transport.cc; Gloo: the group's own timeout or a
// closed connection) from the op, from wait(), or from the Work's recorded
// exception (RethrowIfFailed), and FromException turns it into a Status.
//
// Shrink (re-packing) builds a NEW generation of groups over the survivors,
// the c10d counterpart of ncclCommSplit: every group of generation g lives
// under the store prefix "shrink<g>/" and numbers its members by the
// survivors' new ranks. The groups rendezvous through the job's store while
// the process serving it (TCPStore server) survives; when that process is
// released, the survivors' new rank 0 serves a fresh TCPStore on a free port
// and publishes "host:port" through the old store first. Every rank of the
// old world, leaving ones included, waits in one old-world barrier after
// the survivors connected, so the old store outlives its last use.
// Reshape (re-shaping pp x dp into pp' x dp') is the same step with every
// rank kept and dp' replicas per stage: a new generation of the world and
// data-parallel groups, under the same store.
// Internal to trainer/ (includes LibTorch).
#ifndef DYNMO_TRAINER_COMM_PROCESS_GROUP_TRANSPORT_H_
#define DYNMO_TRAINER_COMM_PROCESS_GROUP_TRANSPORT_H_

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/comm/transport.h"

namespace dynmo::trainer {

// Everything a generation of groups is built from.
struct ProcessGroupBackend {
  std::string name;  // "gloo" or "nccl"
  // One group of `size` members over `store` (already prefixed).
  std::function<c10::intrusive_ptr<c10d::Backend>(
      c10::intrusive_ptr<c10d::Store> store, int rank, int size)>
      make_group;
  // Where tensors must live for this backend (CPU for Gloo, the rank's GPU
  // for NCCL); CPU tensors are copied there and back around each operation.
  c10::Device device = c10::Device(c10::kCPU);
  // Every tensor goes through a separate wire buffer and back, even one
  // already on `device`, as a CPU tensor does on NCCL. The NCCL double sets
  // it, so that a CPU test runs the staging path: a receive copied back
  // before its batch's Work was waited on copies poison.
  bool stage_always = false;
  // This process's address, published when it must serve a new store.
  std::string store_host;
  std::chrono::milliseconds timeout{300000};
};

// The world and data-parallel groups of generation `generation` over `store`
// for rank `rank` of `world_size` (dp replicas adjacent). `store_server_rank`
// is the rank whose process serves `store` (-1: in-process store).
absl::StatusOr<std::unique_ptr<Transport>> ConnectProcessGroups(
    std::shared_ptr<const ProcessGroupBackend> backend,
    c10::intrusive_ptr<c10d::Store> store, int store_server_rank, int rank,
    int world_size, int dp, int generation);

// The job's store: a c10d TCPStore at MASTER_ADDR:MASTER_PORT served by
// rank 0, or an in-process store for a world of one. Throws on failure.
c10::intrusive_ptr<c10d::Store> ConnectJobStore(const DistEnv& env,
                                                std::chrono::milliseconds timeout);

// The address other hosts reach this one at: 127.0.0.1 when MASTER_ADDR is
// loopback (single-host jobs), else this host's name.
std::string AdvertisedHost(const DistEnv& env);

// A backend exception as a Status (first line of the message, UNAVAILABLE).
absl::Status FromException(absl::string_view what, const std::exception& e);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_COMM_PROCESS_GROUP_TRANSPORT_H_
