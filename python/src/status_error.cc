#include "python/src/status_error.h"

#include <string>

namespace dynmo::python {
namespace {

namespace py = pybind11;

// The classes live as long as the interpreter (module attributes hold them);
// these are borrowed pointers set once at import.
PyObject* g_base = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_precondition = nullptr;
PyObject* g_not_found = nullptr;
PyObject* g_unavailable = nullptr;
PyObject* g_permission = nullptr;

PyObject* NewClass(py::module_& m, const char* name, PyObject* builtin) {
  const std::string qualified = std::string("dynmo._core.") + name;
  py::object bases = builtin == nullptr
                         ? py::reinterpret_borrow<py::object>(PyExc_Exception)
                         : py::object(py::make_tuple(
                               py::handle(g_base), py::handle(builtin)));
  PyObject* cls = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(cls));  // steals nothing; the module keeps a ref
  return cls;
}

PyObject* ClassFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return g_invalid;
    case absl::StatusCode::kFailedPrecondition:
      return g_precondition;
    case absl::StatusCode::kNotFound:
      return g_not_found;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return g_unavailable;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return g_permission;
    default:
      return g_base;
  }
}

}  // namespace

void RegisterStatusErrors(py::module_& m) {
  g_base = NewClass(m, "DynmoError", nullptr);
  g_invalid = NewClass(m, "InvalidArgumentError", PyExc_ValueError);
  g_precondition = NewClass(m, "FailedPreconditionError", PyExc_RuntimeError);
  g_not_found = NewClass(m, "NotFoundError", PyExc_LookupError);
  g_unavailable = NewClass(m, "UnavailableError", PyExc_ConnectionError);
  g_permission = NewClass(m, "PermissionDeniedError", PyExc_PermissionError);
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  py::handle cls(ClassFor(status.code()));
  py::object error = cls(py::str(std::string(status.message())));
  error.attr("code") = py::str(absl::StatusCodeToString(status.code()));
  PyErr_SetObject(cls.ptr(), error.ptr());
  throw py::error_already_set();
}

}  // namespace dynmo::python
