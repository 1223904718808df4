"""Summaries: a text that stands in the view for the turns the range removed.

A summary is task state beside the overlay (docs/SUMMARIES.md): the
``condense`` op stores one for the range it moves over, the view carries the
newest one right after the first pair, and a ``rollback`` to a time before
it removes it with the range it replaced. The basic summary is written here,
from the removed turns alone, with no model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard, cast, get_args

from ctxwin.proto import SUMMARY_MARK, SummaryInfo, SummaryKind

from ._blocks import Block, Message, text_of
from ._optimize import TOOL_HEADER

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

_ERROR = re.compile(r"\b(?:error|exception|traceback|failed|failure)\b", re.IGNORECASE)
_PATH_ARGS = ("path", "file_path", "filePath", "file", "filename", "target_file", "absolute_path")
_WRITE_WORDS = ("write", "edit", "create", "replace", "patch", "apply", "insert", "delete", "move")
_READ_WORDS = ("read", "view", "open", "cat", "show", "get_file")
_CLINE_WRITES = ("write_to_file", "replace_in_file")
_ASSISTANT_CAP = 600
_ERROR_CAP = 300
_PATHS_CAP = 60


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


def _texts(message: Message) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content] if content.strip() else []
    if not isinstance(content, list):
        return []
    return [
        block["text"]
        for block in content
        if block.get("type") == "text"
        and isinstance(block.get("text"), str)
        and block["text"].strip()
    ]


def _is_prompt(text: str) -> bool:
    """A user text that is not a tool's output (Cline's results are user texts)."""
    return TOOL_HEADER.match(text) is None and not text.startswith(SUMMARY_MARK)


def _result_texts(message: Message) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    found: list[str] = []
    for block in content:
        if block.get("type") == "tool_result":
            inner = block.get("content")
            text = text_of(block) if isinstance(inner, list) else inner
            if isinstance(text, str):
                found.append(text)
        elif (
            block.get("type") == "text"
            and isinstance(block.get("text"), str)
            and TOOL_HEADER.match(block["text"])
        ):
            found.append(block["text"])
    return found


def _first_line(text: str, cap: int) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= cap else line[: cap - 1] + "…"


def _call_path(block: Block) -> str | None:
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        return None
    for name in _PATH_ARGS:
        value = arguments.get(name)
        if isinstance(value, str) and value:
            return value
    return None


@dataclass(slots=True)
class _Facts:
    prompts: list[tuple[int, str]]
    finals: list[tuple[int, str]]
    read: list[str]
    written: list[str]
    errors: list[str]


def _facts(messages: Sequence[Message], start: int, end: int) -> _Facts:
    facts = _Facts([], [], [], [], [])
    last_text: tuple[int, str] | None = None

    def note(paths: list[str], path: str) -> None:
        if path not in paths:
            paths.append(path)

    for index in range(start, min(end + 1, len(messages))):
        message = messages[index]
        if message.get("role") == "user":
            prompts = [text for text in _texts(message) if _is_prompt(text)]
            if prompts and last_text is not None:
                facts.finals.append(last_text)
                last_text = None
            facts.prompts.extend((index, text) for text in prompts)
            for text in _result_texts(message):
                header = TOOL_HEADER.match(text)
                if header is not None:
                    tool, path = header.group(1), header.group(2)
                    note(facts.written if tool in _CLINE_WRITES else facts.read, path)
                    body = text[header.end() :]
                else:
                    body = text
                if _ERROR.search(body[:200]):
                    facts.errors.append(_first_line(body, _ERROR_CAP))
            continue
        content = message.get("content")
        texts = _texts(message)
        if texts:
            last_text = (index, texts[-1])
        if isinstance(content, list):
            for block in content:
                if block.get("type") != "tool_use":
                    continue
                path = _call_path(block)
                name = str(block.get("name", "")).lower()
                if path is None:
                    continue
                if any(word in name for word in _WRITE_WORDS):
                    note(facts.written, path)
                elif any(word in name for word in _READ_WORDS):
                    note(facts.read, path)
                else:
                    note(facts.read, path)
    if last_text is not None:
        facts.finals.append(last_text)
    return facts


def basic_summary(
    messages: Sequence[Message],
    end: int,
    budget: int,
    count: Callable[[str], int],
    previous: Summary | None = None,
) -> str:
    """The summary ctxwin writes of history messages ``2..end``, no model needed.

    Every user prompt verbatim, newest first when they are over the budget;
    each turn's final assistant text (shortened), the files read and written,
    the tool errors. A previous model summary is kept at the top and only
    the turns after it are added; a previous basic summary is written anew
    from all the removed turns.

    Args:
        messages: the task's history (the internal form).
        end: the last removed message.
        budget: tokens the summary may take.
        count: tokens of a text.
        previous: the summary this one replaces, if any.
    """
    start = 2
    head: list[str] = []
    if previous is not None and previous.kind == "model":
        head = ["Earlier summary:", previous.text.strip(), ""]
        start = previous.end + 1
    facts = _facts(messages, start, end)
    spent = count("\n".join(head))
    # User prompts first (verbatim, the newest kept when over their share of the budget),
    # then the files and errors (short), then the assistant's conclusions with what is left.
    prompt_budget = max(budget * 6 // 10 - spent, budget // 4)
    prompts: list[str] = []
    used = 0
    for _, text in reversed(facts.prompts):
        line = f"- {text.strip()}"
        cost = count(line)
        if used + cost > prompt_budget:
            if not prompts:  # the newest alone is over: its beginning, marked as cut
                keep = max(int(len(line) * prompt_budget / cost * 0.9), 0)
                prompts.append(line[:keep] + " [... cut for length]")
            break
        prompts.append(line)
        used += cost
    prompts.reverse()
    dropped = len(facts.prompts) - len(prompts)
    lines = [*head]
    if prompts:
        lines.append("User messages (verbatim):")
        if dropped:
            lines.append(f"- ({dropped} older user messages left out for length)")
        lines.extend(prompts)
    if facts.written:
        lines.append("Files written: " + _listed(facts.written))
    if facts.read:
        lines.append("Files read: " + _listed(facts.read))
    if facts.errors:
        lines.append("Tool errors:")
        lines.extend(f"- {error}" for error in facts.errors[-10:])
    text = "\n".join(lines)
    left = budget - count(text) - spent
    finals: list[str] = []
    for _, final in reversed(facts.finals):
        short = _first_line(final, _ASSISTANT_CAP) if len(final) > _ASSISTANT_CAP else final
        line = f"- {short.strip()}"
        cost = count(line)
        if cost > left:
            break
        finals.append(line)
        left -= cost
    if finals:
        finals.reverse()
        text += "\nAssistant, at the end of each turn:\n" + "\n".join(finals)
    return text.strip() or "(the removed turns held no text)"


def _listed(paths: list[str]) -> str:
    """Paths, the newest :data:`_PATHS_CAP` when there are more."""
    if len(paths) <= _PATHS_CAP:
        return ", ".join(paths)
    return f"({len(paths) - _PATHS_CAP} earlier left out) " + ", ".join(paths[-_PATHS_CAP:])


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
