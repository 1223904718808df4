"""ctxwin wire protocol: schema, codec with limits, default endpoint, error classifier."""

from __future__ import annotations

from ._classify import is_context_window_error
from ._codec import (
    DEFAULT_MAX_BYTES,
    Limits,
    Reply,
    Request,
    decode_reply,
    decode_request,
    encode_error,
    encode_request,
    encode_result,
    pack,
    unpack,
)
from ._endpoint import ENDPOINT_ENV, default_endpoint, default_runtime_dir, resolve_endpoint
from ._errors import ErrorCode, ProtocolError
from ._schema import (
    COMPACT_KEEP_VALUES,
    KEEP_VALUES,
    OPS,
    TASK_ID_PATTERN,
    USAGE_FIELDS,
    DeletedRange,
    Keep,
    Message,
    Model,
    OpSpec,
    Usage,
    is_valid_task_id,
    validate_args,
)
from ._version import PROTOCOL_VERSION, __version__

__all__ = [
    "COMPACT_KEEP_VALUES",
    "DEFAULT_MAX_BYTES",
    "ENDPOINT_ENV",
    "KEEP_VALUES",
    "OPS",
    "PROTOCOL_VERSION",
    "TASK_ID_PATTERN",
    "USAGE_FIELDS",
    "DeletedRange",
    "ErrorCode",
    "Keep",
    "Limits",
    "Message",
    "Model",
    "OpSpec",
    "ProtocolError",
    "Reply",
    "Request",
    "Usage",
    "__version__",
    "decode_reply",
    "decode_request",
    "default_endpoint",
    "default_runtime_dir",
    "encode_error",
    "encode_request",
    "encode_result",
    "is_context_window_error",
    "is_valid_task_id",
    "pack",
    "resolve_endpoint",
    "unpack",
    "validate_args",
]
