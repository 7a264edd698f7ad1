// absl::Status -> Python exception, for the dynmo._core binding. The module
// defines one exception class per kind of failure, all under DynmoError and
// each also under the built-in Python exception a caller would expect:
//
//   InvalidArgumentError     (DynmoError, ValueError)       INVALID_ARGUMENT, OUT_OF_RANGE
//   FailedPreconditionError  (DynmoError, RuntimeError)     FAILED_PRECONDITION
//   NotFoundError            (DynmoError, LookupError)      NOT_FOUND
//   UnavailableError         (DynmoError, ConnectionError)  UNAVAILABLE, DEADLINE_EXCEEDED
//   PermissionDeniedError    (DynmoError, PermissionError)  PERMISSION_DENIED, UNAUTHENTICATED
//   DynmoError               (Exception)                    every other code
//
// The message is the status's message as is (the coordinator's or the
// validator's one line); the instance's `code` attribute is the code's name
// ("INVALID_ARGUMENT"). Call RegisterStatusErrors once at import, with the
// GIL held; ThrowIfError must also be called with the GIL held.
#ifndef DYNMO_PYTHON_SRC_STATUS_ERROR_H_
#define DYNMO_PYTHON_SRC_STATUS_ERROR_H_

#include "absl/status/status.h"
#include "pybind11/pybind11.h"

namespace dynmo::python {

void RegisterStatusErrors(pybind11::module_& m);

// Raises the exception for a failed status (as pybind11::error_already_set);
// returns when the status is OK.
void ThrowIfError(const absl::Status& status);

}  // namespace dynmo::python

#endif  // DYNMO_PYTHON_SRC_STATUS_ERROR_H_
