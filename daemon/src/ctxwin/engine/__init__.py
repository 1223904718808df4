"""The context-window engine: SPEC.md as pure functions over a task's state (no I/O)."""

from __future__ import annotations

from ctxwin.proto import Strategy

from ._auto_policy import DEFAULT_POLICY, AutoPolicy
from ._blocks import text_of, utf16_len
from ._budget import Budgeting, Calibration, Counter, fit_range, view_origins
from ._condense import AUTO_CONDENSE_FRACTION, condense, condensed, fit_oversized, summary_due
from ._cuts import apply_truncation_notice, compact, compact_subagent
from ._dialect import SRC, Dialect, DialectError
from ._dialects import CLINE, DIALECT_NAMES, DIALECTS, get_dialect, kept_out_text
from ._history import History, ResyncRequired
from ._ledger import CacheEntry, CacheLedger, Receipt
from ._mapped import MappedHistory
from ._mapped_view import Pieces
from ._notices import DEFAULT_NOTICES, Notices
from ._optimize import Optimisation, optimize_file_reads
from ._overlay import CorruptStateError, MessageUpdates, Overlay
from ._parts import MEDIA, MEDIA_TYPES, UNREAD, held_text, unrecognised
from ._patch import PatchMaker, view_patch
from ._range import Keep, next_truncation_range
from ._reads import (
    DEFAULT_READ_RULES,
    DEFAULT_READ_TOOLS,
    SHELL_READ_PATTERN,
    ReadRules,
    ReadTool,
    cached_pattern,
    compile_pattern,
    read_tool_from_config,
    read_tool_pattern,
    shell_reads,
)
from ._request import Request, ViewStrategy
from ._state import TaskState
from ._strategy import STRATEGIES, plan
from ._summary import SUMMARY_MARK, SUMMARY_PROMPT, Summary, basic_summary, summary_prompt
from ._task_ledger import task_ledger, user_instructions
from ._view import keep_from, truncated_messages
from ._window import (
    CompactDecision,
    WindowInfo,
    context_window_info,
    should_compact,
    total_tokens,
)

__all__ = [
    "AUTO_CONDENSE_FRACTION",
    "CLINE",
    "DEFAULT_NOTICES",
    "DEFAULT_POLICY",
    "DEFAULT_READ_RULES",
    "DEFAULT_READ_TOOLS",
    "DIALECTS",
    "DIALECT_NAMES",
    "MEDIA",
    "MEDIA_TYPES",
    "SHELL_READ_PATTERN",
    "SRC",
    "STRATEGIES",
    "SUMMARY_MARK",
    "SUMMARY_PROMPT",
    "UNREAD",
    "AutoPolicy",
    "Budgeting",
    "CacheEntry",
    "CacheLedger",
    "Calibration",
    "CompactDecision",
    "CorruptStateError",
    "Counter",
    "Dialect",
    "DialectError",
    "History",
    "Keep",
    "MappedHistory",
    "MessageUpdates",
    "Notices",
    "Optimisation",
    "Overlay",
    "PatchMaker",
    "Pieces",
    "ReadRules",
    "ReadTool",
    "Receipt",
    "Request",
    "ResyncRequired",
    "Strategy",
    "Summary",
    "TaskState",
    "ViewStrategy",
    "WindowInfo",
    "apply_truncation_notice",
    "basic_summary",
    "cached_pattern",
    "compact",
    "compact_subagent",
    "compile_pattern",
    "condense",
    "condensed",
    "context_window_info",
    "fit_oversized",
    "fit_range",
    "get_dialect",
    "held_text",
    "keep_from",
    "kept_out_text",
    "next_truncation_range",
    "optimize_file_reads",
    "plan",
    "read_tool_from_config",
    "read_tool_pattern",
    "shell_reads",
    "should_compact",
    "summary_due",
    "summary_prompt",
    "task_ledger",
    "text_of",
    "total_tokens",
    "truncated_messages",
    "unrecognised",
    "user_instructions",
    "utf16_len",
    "view_origins",
    "view_patch",
]
