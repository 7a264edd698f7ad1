// ConnectNcclTransport: the job's store plus NCCL process groups on GPU
// LOCAL_RANK, for builds against a CUDA LibTorch (CMake option
// DYNMO_WITH_NCCL, defined when Torch has CUDA and nccl.h was found).
// The trainer's tensors already live on the rank's GPU (--device=cuda), so
// activations, gradients and migrating layers go GPU to GPU; only the few
// control tensors made on the CPU (counts, the migration header) are
// copied over and back. Point-to-point batches are coalesced
// (startCoalescing / endCoalescing through c10d::Backend, p2p_batch.h),
// never raw groupStart / groupEnd. A shrink builds new NCCL
// communicators over the survivors under a new store prefix, c10d's
// counterpart of ncclCommSplit. Elsewhere the constructor is UNIMPLEMENTED.
#include "trainer/comm/transport.h"

#ifdef DYNMO_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <stdlib.h>

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "trainer/comm/process_group_transport.h"
#endif

namespace dynmo::trainer {

#ifdef DYNMO_WITH_NCCL
absl::StatusOr<std::unique_ptr<Transport>> ConnectNcclTransport(
    const DistEnv& env, const TransportOptions& options) {
  if (options.dp < 1 || env.world_size % options.dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WORLD_SIZE=", env.world_size, " is not a multiple of --dp=", options.dp));
  }
  const std::chrono::milliseconds timeout(int64_t{options.timeout_s} * 1000);
  // A failed peer as a Status, not a SIGABRT: CleanUpOnly (2) makes the
  // watchdog abort the communicators of a timed-out or failed collective
  // and record the error on its Work, without tearing the process down
  // (PyTorch's default, SkipCleanUp, kills it). The next op, wait() or
  // RethrowIfFailed then throws c10::DistBackendError, which the transport
  // reports as UNAVAILABLE. A value the user set is kept.
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  try {
    c10::intrusive_ptr<c10d::Store> store = ConnectJobStore(env, timeout);
    auto backend = std::make_shared<ProcessGroupBackend>();
    backend->name = "nccl";
    backend->device = c10::Device(
        c10::kCUDA, static_cast<c10::DeviceIndex>(
                        options.device_index >= 0 ? options.device_index : env.local_rank));
    backend->make_group = [timeout](c10::intrusive_ptr<c10d::Store> s, int rank,
                                    int size) {
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = timeout;
      return c10::intrusive_ptr<c10d::Backend>(
          c10::make_intrusive<c10d::ProcessGroupNCCL>(std::move(s), rank, size, o));
    };
    backend->store_host = AdvertisedHost(env);
    backend->timeout = timeout;
    return ConnectProcessGroups(std::move(backend), std::move(store),
                                env.world_size == 1 ? -1 : 0, env.rank,
                                env.world_size, options.dp, /*generation=*/0);
  } catch (const std::exception& e) {
    return FromException(
        absl::StrCat("rank ", env.rank, " connecting NCCL via ", env.master_addr,
                     ":", env.master_port),
        e);
  }
}
#else
absl::StatusOr<std::unique_ptr<Transport>> ConnectNcclTransport(
    const DistEnv&, const TransportOptions&) {
  return absl::UnimplementedError(
      "this dynmo-train was built without NCCL (needs a CUDA LibTorch and "
      "libnccl; CMake option DYNMO_WITH_NCCL)");
}
#endif

}  // namespace dynmo::trainer
