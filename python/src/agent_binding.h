// agent::Agent (agent/agent.h) and agent::OperatorClient's SetPolicy in
// dynmo._core. Plain values cross the boundary: the config as an
// `AgentConfig` object with attributes, a report's layers as tuples
// (layer, fwd_s, bwd_s, wgrad_s, params, resident_bytes, activation_bytes),
// plans and stats as dicts (the package's dataclasses wrap them). Every
// failed absl::Status raises (status_error.h) with the agent's, the
// validator's or the coordinator's message.
//
// The GIL is released around every call into the agent (they take its lock
// or wait on the network), so other Python threads run meanwhile. An Agent
// is thread-safe like agent::Agent.
#ifndef DYNMO_PYTHON_SRC_AGENT_BINDING_H_
#define DYNMO_PYTHON_SRC_AGENT_BINDING_H_

#include "pybind11/pybind11.h"

namespace dynmo::python {

void BindAgent(pybind11::module_& m);

}  // namespace dynmo::python

#endif  // DYNMO_PYTHON_SRC_AGENT_BINDING_H_
