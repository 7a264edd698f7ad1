// The decision core in dynmo._core, through the same code as the
// `dynmo-plan` and `dynmo-sim` programs (coordinator/tools/plan_command.h,
// sim_command.h): the Python side passes the tools' flags and JSON text and
// gets the tools' JSON back, so validation and messages are theirs.
//
//   plan_json(problem_json: str, flags: list[str]) -> str
//   simulate_json(flags: list[str], gantt: bool) -> tuple[str, str | None]
//   replay_json(flags: list[str]) -> str
//   split_write(format: str, boundaries: list[int]) -> str
//   split_read(format: str, value_json: str, num_layers=-1, num_stages=-1) -> list[int]
//
// split_* are the plan formats' codec (formats/plan_formats.h):
// a split as torchtitan, Megatron or DeepSpeed take it, to and from
// boundaries, as JSON text.
//
// Errors raise InvalidArgumentError (status_error.h). The GIL is released
// while the core computes.
#ifndef DYNMO_PYTHON_SRC_DECISION_BINDING_H_
#define DYNMO_PYTHON_SRC_DECISION_BINDING_H_

#include "pybind11/pybind11.h"

namespace dynmo::python {

void BindDecision(pybind11::module_& m);

}  // namespace dynmo::python

#endif  // DYNMO_PYTHON_SRC_DECISION_BINDING_H_
