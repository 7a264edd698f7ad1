"""The exceptions every DynMo failure raises.

All derive from DynmoError and also from the built-in exception a caller
would expect (an InvalidArgumentError is a ValueError). Each instance carries
``code``, the name of the failed status's code ("INVALID_ARGUMENT"), and its
message is the validator's or the coordinator's one line.
"""
from dynmo._core import (  # noqa: F401  (re-exported)
    DynmoError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)

__all__ = [
    "DynmoError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "UnavailableError",
]
