// ConnectGlooTransport: the job's store plus Gloo process groups, handed to
// the backend-neutral transport of process_group_transport.h, optionally
// behind the NCCL test double (nccl_double.h). The only file that names Gloo.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <cstdlib>
#include <exception>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "trainer/comm/nccl_double.h"
#include "trainer/comm/process_group_transport.h"
#include "trainer/comm/transport.h"

namespace dynmo::trainer {
namespace {

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
    c10::intrusive_ptr<c10d::Store> store = ConnectJobStore(env, timeout);
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    gloo_options->devices.push_back(GlooDevice(env));
    auto backend = std::make_shared<ProcessGroupBackend>();
    backend->name = options.nccl_double ? "nccl-double" : "gloo";
    backend->make_group = [gloo_options, double_it = options.nccl_double](
                              c10::intrusive_ptr<c10d::Store> s, int rank, int size) {
      auto gloo = c10::intrusive_ptr<c10d::Backend>(
          c10::make_intrusive<c10d::ProcessGroupGloo>(std::move(s), rank, size,
                                                      gloo_options));
      return double_it ? MakeNcclDouble(std::move(gloo)) : gloo;
    };
    backend->stage_always = options.nccl_double;
    backend->store_host = AdvertisedHost(env);
    backend->timeout = timeout;
    return ConnectProcessGroups(std::move(backend), std::move(store),
                                env.world_size == 1 ? -1 : 0, env.rank,
                                env.world_size, options.dp, /*generation=*/0);
  } catch (const std::exception& e) {
    return FromException(
        absl::StrCat("rank ", env.rank, " connecting to ", env.master_addr, ":",
                     env.master_port),
        e);
  }
}

}  // namespace dynmo::trainer
