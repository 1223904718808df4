"""Summaries: a text that stands in the view for the turns the range removed.

A summary is task state beside the overlay (docs/SUMMARIES.md): the
``condense`` op stores one for the range it moves over, the view carries the
newest one right after the first pair, and a ``rollback`` to a time before
it removes it with the range it replaced. The basic summary is written here,
from the removed turns alone, with no model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, cast, get_args

from ctxwin.proto import SUMMARY_MARK, SummaryInfo, SummaryKind

from ._blocks import Block, Message
from ._reads import ReadRules
from ._task_ledger import task_ledger

SUMMARY_KINDS: tuple[SummaryKind, ...] = get_args(SummaryKind)

SUMMARY_PROMPT = (
    "Write a summary of this conversation so far, to replace its earlier turns: they will "
    "be removed from your context and this summary will stand in for them. Use these "
    "headings, each with short bullet points:\n"
    "1. Goal: what the user asked for, with their exact words for every instruction, "
    "value and name they gave.\n"
    "2. Constraints and decisions: what was agreed or decided, and why.\n"
    "3. Progress: what is done and what is not.\n"
    "4. Files touched: every file read or written, by path.\n"
    "5. Errors met: each error and how it was resolved, or that it is not.\n"
    "6. Next step: what you were about to do.\n"
    "Answer with the summary only, no tool calls."
)
"""The instruction that asks a model for a summary (the default; configurable per call)."""

PREVIOUS_SUMMARY = (
    "\n\nThe conversation already has a summary of turns removed before; update it with "
    "what happened since, keeping what still holds:\n"
)


@dataclass(frozen=True, slots=True)
class Summary:
    """One stored summary and the range it stands for.

    Attributes:
        ts: when it was stored (a rollback to before it removes it).
        text: the summary as written (the view adds the mark around it).
        end: it stands for history messages ``2..end``.
        before: the deleted range it replaced (restored by a rollback).
        kind: ``basic`` (written by ctxwin) or ``model``.
        length: the history's length when it was stored (condenses too close
            together are refused).
    """

    ts: int
    text: str
    end: int
    before: list[int] | None
    kind: SummaryKind
    length: int

    def dump(self) -> dict[str, Any]:
        """The stored form (``ctxwin.json``, Redis)."""
        return {
            "ts": self.ts,
            "text": self.text,
            "end": self.end,
            "before": self.before,
            "kind": self.kind,
            "length": self.length,
        }

    def wire(self) -> SummaryInfo:
        """What ``condense`` and ``inspect`` show of it."""
        return {
            "ts": self.ts,
            "kind": self.kind,
            "range": [2, self.end],
            "text": self.text,
            "chars": len(self.text),
        }

    @classmethod
    def load(cls, value: object) -> Summary:
        """Read the stored form.

        Raises:
            ValueError: not the stored form (the message names no content).
        """
        if not isinstance(value, dict):
            raise ValueError("a summary must be a map")
        ts, text, end = value.get("ts"), value.get("text"), value.get("end")
        before, kind, length = value.get("before"), value.get("kind"), value.get("length")
        if (
            not _is_int(ts)
            or not isinstance(text, str)
            or not _is_int(end)
            or end < 2
            or kind not in SUMMARY_KINDS
            or not _is_int(length)
            or not (
                before is None
                or (
                    isinstance(before, list)
                    and len(before) == 2
                    and before[0] == 2
                    and all(_is_int(bound) for bound in before)
                )
            )
        ):
            raise ValueError("a summary has an unexpected shape")
        before = None if before is None else list(before)
        return cls(ts, text, end, before, cast(SummaryKind, kind), length)

    @classmethod
    def load_all(cls, value: object) -> list[Summary]:
        """Read a task's stored list (None: no summaries).

        Raises:
            ValueError: not the stored form (the message names no content).
        """
        if value is None:
            return []
        if not isinstance(value, list):
            raise ValueError("summaries must be a list")
        return [cls.load(item) for item in value]

    def block(self) -> Block:
        """The text block the view carries."""
        return {"type": "text", "text": summary_text(self.text, self.end)}


def carried(
    summaries: Sequence[Summary],
    deleted_range: Sequence[int] | None,
    dropped: Sequence[Sequence[int]] = (),
) -> Summary | None:
    """The summary the view carries: the newest, while the range (or the deleted set, the
    ``auto`` strategy's) covers what it stands for.

    A range moved back (a caller's range, a rewound history) below the
    summary's end shows the messages it stood for again, and not the summary.
    """
    if not summaries:
        return None
    newest = summaries[-1]
    if deleted_range is not None and deleted_range[1] >= newest.end:
        return newest
    return newest if dropped and dropped[-1][1] >= newest.end else None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def summary_text(text: str, end: int) -> str:
    """The summary as the view shows it, marked as standing for removed turns.

    ``end`` (the last message it stands for) is not named: a native dialect's
    internal indices are not the caller's.
    """
    return (
        f"{SUMMARY_MARK} Earlier turns of this conversation were removed from the context "
        f"to fit the model's window; this summary stands for them.\n\n{text}"
    )


def place_summary(view: list[Message], block: Block) -> None:
    """Put the summary into ``view`` right after the first pair (in place).

    It joins the first kept message when that is a user message, after the
    results that must open it; otherwise it ends message 1 (never a message
    of its own: a view holds exactly the history's messages).
    """
    if len(view) > 2 and view[2].get("role") == "user":
        target = 2
    elif len(view) > 1:
        target = 1
    else:
        return
    message = view[target]
    content = message.get("content")
    if isinstance(content, list):
        blocks: list[Block] = list(content)
    elif isinstance(content, str) and content:
        blocks = [{"type": "text", "text": content}]
    else:
        blocks = []
    if target == 2:
        place = 0
        while place < len(blocks) and blocks[place].get("type") == "tool_result":
            place += 1
        blocks.insert(place, block)
    else:
        blocks.append(block)
    view[target] = {**message, "content": blocks}


# The basic summary ----------------------------------------------------------


def basic_summary(
    messages: Sequence[Message],
    end: int,
    budget: int,
    count: Callable[[str], int],
    previous: Summary | None = None,
    reads: ReadRules | None = None,
) -> str:
    """The summary ctxwin writes of history messages ``2..end``, no model needed.

    It is the task ledger of those messages (:func:`task_ledger`: every user
    instruction verbatim, the calls, the files read and written) with each
    turn's last assistant text in what room is left. A previous model
    summary is kept at the top and only the turns after it are added; a
    previous basic summary is written anew from all the removed turns.

    Args:
        messages: the task's history (the internal form).
        end: the last removed message.
        budget: tokens the summary may take.
        count: tokens of a text.
        previous: the summary this one replaces, if any.
        reads: the task's read tools (a native dialect's), None for the defaults.
    """
    start = 2
    head = ""
    if previous is not None and previous.kind == "model":
        head = f"Earlier summary:\n{previous.text.strip()}\n\n"
        start = previous.end + 1
    spent = count(head) if head else 0
    ledger = task_ledger(
        messages, [range(start, end + 1)], max(budget - spent, 0), count, reads, conclusions=True
    )
    return (head + ledger).strip() or "(the removed turns held no text)"


def summary_prompt(previous: Summary | None, instruction: str = SUMMARY_PROMPT) -> str:
    """The instruction that asks a model for a summary, with the previous one to update."""
    if previous is None:
        return instruction
    return instruction + PREVIOUS_SUMMARY + previous.text


__all__ = [
    "SUMMARY_KINDS",
    "SUMMARY_MARK",
    "SUMMARY_PROMPT",
    "Summary",
    "basic_summary",
    "carried",
    "place_summary",
    "summary_prompt",
    "summary_text",
]
