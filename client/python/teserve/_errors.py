"""Python exceptions for the gRPC status codes a teserve server returns."""
from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

__all__ = [
    "TeserveError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded",
    "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented", "Internal",
    "Unavailable", "DataLoss", "Unauthenticated", "error_from_rpc",
]


class TeserveError(Exception):
    """A failed teserve call.

    Attributes:
        code: the gRPC status code (``grpc.StatusCode``) the server (or the channel)
            returned.
        message: the server's message unchanged, e.g. ``"inputs[0].shape: expected last
            dimension 32 (hidden_size of layer 'layers.0'), got [4, 16]"``.
        method: the RPC that failed (``"Forward"``), when known.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None,
                 method: Optional[str] = None) -> None:
        if code is not None:
            self.code = code
        self.message = message
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{self.code.name}: {message}")


def _subclass(name: str, code: grpc.StatusCode, doc: str) -> Type[TeserveError]:
    return type(name, (TeserveError,), {"code": code, "__doc__": doc, "__module__": "teserve"})


Cancelled = _subclass("Cancelled", grpc.StatusCode.CANCELLED, "The call was cancelled.")
Unknown = _subclass("Unknown", grpc.StatusCode.UNKNOWN, "UNKNOWN status.")
InvalidArgument = _subclass(
    "InvalidArgument", grpc.StatusCode.INVALID_ARGUMENT,
    "A bad spec or tensor; the message names the field and says expected vs got.")
DeadlineExceeded = _subclass("DeadlineExceeded", grpc.StatusCode.DEADLINE_EXCEEDED,
                             "The call ran past its timeout.")
NotFound = _subclass("NotFound", grpc.StatusCode.NOT_FOUND,
                     "An unknown session, activation handle or parameter name.")
AlreadyExists = _subclass("AlreadyExists", grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS status.")
PermissionDenied = _subclass("PermissionDenied", grpc.StatusCode.PERMISSION_DENIED,
                             "PERMISSION_DENIED status.")
ResourceExhausted = _subclass(
    "ResourceExhausted", grpc.StatusCode.RESOURCE_EXHAUSTED,
    "A server limit was hit (--max_sessions, --max_message_bytes, live handles, memory).")
FailedPrecondition = _subclass("FailedPrecondition", grpc.StatusCode.FAILED_PRECONDITION,
                               "The session is not in a state that allows the call.")
Aborted = _subclass("Aborted", grpc.StatusCode.ABORTED, "ABORTED status.")
OutOfRange = _subclass("OutOfRange", grpc.StatusCode.OUT_OF_RANGE, "OUT_OF_RANGE status.")
Unimplemented = _subclass("Unimplemented", grpc.StatusCode.UNIMPLEMENTED,
                          "The server does not implement this (e.g. on this device).")
Internal = _subclass("Internal", grpc.StatusCode.INTERNAL, "An internal server error.")
Unavailable = _subclass("Unavailable", grpc.StatusCode.UNAVAILABLE,
                        "The server cannot be reached (down, wrong address, shutting down).")
DataLoss = _subclass("DataLoss", grpc.StatusCode.DATA_LOSS, "DATA_LOSS status.")
Unauthenticated = _subclass("Unauthenticated", grpc.StatusCode.UNAUTHENTICATED,
                            "Missing or rejected credentials (token).")

_BY_CODE: Dict[grpc.StatusCode, Type[TeserveError]] = {
    cls.code: cls
    for cls in (Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
                Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}


def error_from_rpc(error: grpc.RpcError, method: Optional[str] = None) -> TeserveError:
    """The TeserveError subclass for a ``grpc.RpcError`` (code and details kept)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    cls = _BY_CODE.get(code, TeserveError)
    return cls(details or "", code=code, method=method)
