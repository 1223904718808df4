"""``ctxwin replay``: a saved conversation sent to the daemon turn by turn, as an agent
would, and what changed the model's view on the way.

:mod:`._run` holds the loop, :mod:`._views` maps each view back to the history,
:mod:`._report` holds what was found, :mod:`._command` is the command itself.
"""

from ._events import counted, message_tokens
from ._report import (
    CALIBRATION_FLOOR,
    OverWindow,
    ReplayEvent,
    ReplayReport,
    ReplayTurn,
    TokenCounts,
    unrecognised_line,
    usage_line,
)
from ._run import (
    USAGE_MODES,
    Progress,
    ReplayOptions,
    UsageMode,
    input_tokens,
    replay,
)
from ._views import (
    FILE_READ,
    NOTICE,
    NOTICE_EDIT,
    REPAIRED,
    SUMMARY,
    NativeViews,
    Overlay,
    Sources,
    Variant,
    ViewState,
    original_text,
    parse_sources,
    parse_updates,
    set_text,
    text_of,
    view_state,
    with_overlay,
)

__all__ = [
    "CALIBRATION_FLOOR",
    "FILE_READ",
    "NOTICE",
    "NOTICE_EDIT",
    "REPAIRED",
    "SUMMARY",
    "USAGE_MODES",
    "NativeViews",
    "OverWindow",
    "Overlay",
    "Progress",
    "ReplayEvent",
    "ReplayOptions",
    "ReplayReport",
    "ReplayTurn",
    "Sources",
    "TokenCounts",
    "UsageMode",
    "Variant",
    "ViewState",
    "counted",
    "input_tokens",
    "message_tokens",
    "original_text",
    "parse_sources",
    "parse_updates",
    "replay",
    "set_text",
    "text_of",
    "unrecognised_line",
    "usage_line",
    "view_state",
    "with_overlay",
]
