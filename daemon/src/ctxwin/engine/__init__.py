"""The context-window engine: SPEC.md as pure functions over a task's state (no I/O)."""

from __future__ import annotations

from ._blocks import text_of, utf16_len
from ._budget import Budgeting, Calibration, Counter, Strategy, fit_range
from ._history import History, ResyncRequired, view_patch
from ._notices import DEFAULT_NOTICES, Notices
from ._optimize import Optimisation, optimize_file_reads
from ._overlay import CorruptStateError, MessageUpdates, Overlay
from ._range import Keep, next_truncation_range
from ._state import (
    CompactResult,
    InMemoryResult,
    OptimizeResult,
    PlanResult,
    PrepareResult,
    SubagentResult,
    TaskState,
)
from ._view import keep_from, truncated_messages
from ._window import (
    CompactDecision,
    WindowInfo,
    context_window_info,
    should_compact,
    total_tokens,
)

__all__ = [
    "DEFAULT_NOTICES",
    "Budgeting",
    "Calibration",
    "CompactDecision",
    "CompactResult",
    "CorruptStateError",
    "Counter",
    "History",
    "InMemoryResult",
    "Keep",
    "MessageUpdates",
    "Notices",
    "Optimisation",
    "OptimizeResult",
    "Overlay",
    "PlanResult",
    "PrepareResult",
    "ResyncRequired",
    "Strategy",
    "SubagentResult",
    "TaskState",
    "WindowInfo",
    "context_window_info",
    "fit_range",
    "keep_from",
    "next_truncation_range",
    "optimize_file_reads",
    "should_compact",
    "text_of",
    "total_tokens",
    "truncated_messages",
    "utf16_len",
    "view_patch",
]
