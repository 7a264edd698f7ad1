// dynmo._core: the C++ half of the `dynmo` Python package — the agent
// (agent_binding.h), the decision core through the tools' code
// (decision_binding.h) and the exceptions every failed status becomes
// (status_error.h). The pure-Python package (python/dynmo) wraps these in
// dataclasses; import `dynmo`, not this module.
#include "pybind11/pybind11.h"
#include "python/src/agent_binding.h"
#include "python/src/decision_binding.h"
#include "python/src/status_error.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "DynMo's agent and decision core (C++); use the dynmo package.";
  m.attr("__version__") = DYNMO_VERSION;
  dynmo::python::RegisterStatusErrors(m);
  dynmo::python::BindAgent(m);
  dynmo::python::BindDecision(m);
}
