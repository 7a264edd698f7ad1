// dynmo._nccl_double: the NCCL completion double of trainer/comm/nccl_double.h
// as a torch.distributed backend, so the Python path's tests run against
// "a receive is poisoned until the Work NCCL would complete is waited on".
// dynmo.nccl_double.register() registers create_backend under the name
// "nccl-double".
//
// Built against torch's own pybind11 (torch/include/pybind11) and linked
// with libtorch_python, so c10d::Store and c10d::Backend cross this module
// as the very pybind types torch._C registered (intrusive_ptr holders,
// torch/csrc/utils/pybind.h): a Store from torch.distributed comes in, a
// Backend torch.distributed can register on a ProcessGroup goes out.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/utils/pybind.h>

#include <pybind11/chrono.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>

#include "trainer/comm/nccl_double.h"

namespace {

// A Gloo group over `store` wrapped in the double. Its devices are the ones
// torch.distributed's own ProcessGroupGloo picks: the interfaces of
// GLOO_SOCKET_IFNAME (comma-separated), else the default device (this
// host's address, or loopback when the name does not resolve).
c10::intrusive_ptr<c10d::Backend> CreateBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* interfaces = std::getenv("GLOO_SOCKET_IFNAME");
  if (interfaces != nullptr && interfaces[0] != '\0') {
    std::stringstream list(interfaces);
    for (std::string name; std::getline(list, name, ',');) {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    }
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = static_cast<int>(options->devices.size()) * 2;
  return dynmo::trainer::MakeNcclDouble(
      c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options));
}

}  // namespace

PYBIND11_MODULE(_nccl_double, m) {
  m.doc() =
      "The NCCL completion double (trainer/comm/nccl_double.h) as a "
      "torch.distributed backend; register it with dynmo.nccl_double.register().";
  // The rendezvous inside ProcessGroupGloo blocks until every rank joined:
  // without the GIL, as torch's own constructors.
  m.def("create_backend", &CreateBackend, pybind11::arg("store"), pybind11::arg("rank"),
        pybind11::arg("size"), pybind11::arg("timeout"),
        pybind11::call_guard<pybind11::gil_scoped_release>(),
        "create_backend(store, rank, size, timeout) -> torch Backend: a Gloo group "
        "of `size` ranks over `store` behind the NCCL double (the creator "
        "torch.distributed.Backend.register_backend takes).");
}
