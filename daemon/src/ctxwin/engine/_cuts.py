"""Cuts on a task: the notices a cut puts in (SPEC.md §5), where a native dialect's cut
stops (docs/DIALECTS.md), and the cuts forced from outside ``prepare_request`` (§8).

How far ``prepare_request`` cuts is its strategy's (``_strategy.py``, ``_auto.py``);
a cut for a summary is ``_condense.py``'s. Each takes its notices and its stop from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ctxwin.proto import CompactResult, CompactSubagentResult

from ._blocks import Message, text_of, wire_view
from ._dialect import Dialect
from ._notices import Notices
from ._optimize import Optimisation
from ._overlay import EDIT_UNDEFINED, Overlay
from ._range import Keep, next_truncation_range
from ._view import NEW_TEXT_BLOCK, ViewCache, truncated_messages

__all__ = [
    "add_truncation_notice",
    "apply_truncation_notice",
    "compact",
    "compact_subagent",
    "keep_newest",
]


class CutTask(Protocol):
    """What the cuts use of a task's state (``TaskState`` has it)."""

    @property
    def overlay(self) -> Overlay:
        """The task's edits."""
        ...

    @property
    def notices(self) -> Notices:
        """The notice texts."""
        ...

    @property
    def dialect(self) -> Dialect:
        """The task's message dialect."""
        ...

    @property
    def revision(self) -> int:
        """Grows with each change to write."""
        ...

    @property
    def deleted_range(self) -> list[int] | None:
        """The inclusive ``[2, end]`` range of messages not sent, or None."""
        ...

    @deleted_range.setter
    def deleted_range(self, value: Sequence[int] | None) -> None: ...

    def cache_for(self, messages: Sequence[Message]) -> ViewCache | None:
        """The view cache of ``messages``, if the task holds it."""
        ...

    def optimize(self, messages: Sequence[Message], ts: int, whole: bool = False) -> Optimisation:
        """Replace superseded file reads in the overlay, with no write asked for."""
        ...

    def mark_changed(self) -> None:
        """Ask for a write."""
        ...

    def truncated_messages(self, messages: Sequence[Message]) -> list[Message]:
        """The view of ``messages``."""
        ...


def keep_newest(
    state: CutTask,
    messages: Sequence[Message],
    before: list[int] | None,
    proposed: list[int] | None,
) -> list[int] | None:
    """A native dialect's range stops short of the turn the newest message answers.

    SPEC.md §4 drops the results after a cut; when those are the newest
    message, the view would lose it, so the cut keeps that whole turn
    (docs/DIALECTS.md). The range still never shrinks.
    """
    if (
        not state.dialect.native
        or proposed is None
        or len(messages) < 2
        or proposed[1] != len(messages) - 2
    ):
        return proposed
    content = messages[-1].get("content")
    if not isinstance(content, list) or not any(
        block.get("type") == "tool_result" for block in content
    ):
        return proposed
    floor = before[1] if before else proposed[0] - 1
    return [proposed[0], max(proposed[1] - 2, floor)]


def _no_text_first(message: Message) -> bool:
    """Whether a message's content is a list whose block 0 holds no text to replace."""
    content = message.get("content")
    return isinstance(content, list) and bool(content) and text_of(content[0]) is None


def _first_text_block(message: Message) -> int:
    """The index of the first text block, or :data:`NEW_TEXT_BLOCK` when there is none."""
    content = message.get("content")
    if isinstance(content, list):
        for index, block in enumerate(content):
            if block.get("type") == "text":
                return index
    return NEW_TEXT_BLOCK


def add_truncation_notice(state: CutTask, ts: int, messages: Sequence[Message] = ()) -> bool:
    """Replace message 1 with the truncation notice unless it has edits already.

    In a native dialect the notice replaces message 1's first text block,
    or is added as a new text block when it has none (never into an
    opaque part, docs/DIALECTS.md). The Cline dialect edits block 0 as
    SPEC.md §5 says, unless block 0 holds no text (a ``tool_use``), where
    the edit would change nothing and the model would never read it: then
    the first text block, or a new one put first.
    """
    if 1 in state.overlay:
        return False
    block = 0
    if len(messages) > 1 and (state.dialect.native or _no_text_first(messages[1])):
        block = _first_text_block(messages[1])
    state.overlay.append(1, EDIT_UNDEFINED, block, [ts, "text", [state.notices.truncation], []])
    return True


def _add_first_user_replacement(state: CutTask, ts: int, messages: Sequence[Message]) -> bool:
    """Replace message 0's first text block unless it has edits already."""
    if 0 in state.overlay or not messages:
        return False
    content = messages[0].get("content")
    if not isinstance(content, list) or not content:
        return False
    first = content[0]
    if first.get("type") != "text" or not text_of(first):
        return False
    state.overlay.append(0, EDIT_UNDEFINED, 0, [ts, "text", [state.notices.first_user], []])
    return True


def apply_truncation_notice(
    state: CutTask, ts: int, messages: Sequence[Message], keep_task: bool = False
) -> bool:
    """Both notices of SPEC.md §5; True when either was added.

    With ``keep_task`` only the message-1 notice: the task in message 0 stays as it is.
    """
    changed = add_truncation_notice(state, ts, messages)
    if not keep_task:
        changed = _add_first_user_replacement(state, ts, messages) or changed
    if changed:
        state.mark_changed()
    return changed


def compact_subagent(state: CutTask, messages: Sequence[Message], ts: int) -> CompactSubagentResult:
    """Make a subagent's conversation fit: optimise in memory, else cut a quarter (§8)."""
    result = state.optimize(messages, ts, whole=True)
    conversation: Sequence[Message] = messages
    compacted = True
    if result.changed:
        conversation = truncated_messages(
            messages,
            None,
            state.overlay,
            state.notices,
            strict=state.dialect.strict,
            cache=state.cache_for(messages),
        )
    if not result.changed or result.need_to_truncate:
        current = state.deleted_range
        proposed = next_truncation_range(conversation, current, "quarter")
        if proposed[1] < proposed[0] or proposed == current:
            compacted = False
        else:
            state.deleted_range = keep_newest(state, messages, current, proposed)
    view = wire_view(state.truncated_messages(messages))
    return {"compacted": compacted, "deleted_range": state.deleted_range, "messages": view}


def compact(
    state: CutTask, messages: Sequence[Message], keep: Keep, ts: int, keep_task: bool = False
) -> CompactResult:
    """Force a cut: after a context-window error (quarter) or a summary (none) (§8).

    ``keep_task`` leaves the first user message (the task) as it is (SPEC.md §5).
    """
    before = state.revision
    current = state.deleted_range
    proposed = next_truncation_range(messages, current, keep)
    state.deleted_range = keep_newest(state, messages, current, proposed)
    apply_truncation_notice(state, ts, messages, keep_task)
    return {"deleted_range": state.deleted_range, "changed": state.revision != before}
