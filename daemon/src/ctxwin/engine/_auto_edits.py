"""The edits ``auto`` makes, each with its receipt (docs/STRATEGIES.md, docs/PRICING.md).

A :class:`Planner` holds one decision's history, view and counts: it finds
the candidates (file reads a later read supersedes, tool results to mask with
a stub), tells whether a batch pays back, applies it, cuts whole turns and
shortens what is too large. *When* each step is taken is ``_auto.py``'s.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from ctxwin.proto import PRICE_SHEETS, PriceSheet

from ._auto_policy import AutoPolicy
from ._blocks import Message, text_of, tool_calls
from ._budget import Budgeting, view_origins
from ._dialect import Dialect
from ._ledger import Receipt, payback_turns
from ._optimize import TOOL_HEADER
from ._overlay import EDIT_NO_FILE_READ, EDIT_UNDEFINED, Overlay
from ._reads import ReadRules, native_reads
from ._summary import Summary
from ._task_ledger import task_ledger, typed_parts
from ._view import apply_overlay

__all__ = ["Candidate", "HistoryFacts", "Planner", "Result"]

DECISION_SHEET = PRICE_SHEETS["anthropic"]
"""The sheet decisions assume when a task has none (its write premium is the highest)."""

LEDGER_FLOOR = 400.0
"""Tokens a first ledger is expected to take, before one was written."""

STUB_ARGS = 160
"""Characters of a masked call's arguments kept in its stub."""


@dataclass(slots=True)
class HistoryFacts:
    """What ``auto`` reads off a history once, extended as it grows (:meth:`Planner.facts`).

    Attributes:
        seen: how many first messages it holds the facts of.
        anchor: the last of them (another object there: the history is another one).
        starts: where turns begin (an assistant message after a user one, from index 3).
        users: the indices of the user messages.
        latest: each file's latest read, ``(index, block)``.
    """

    seen: int = 0
    anchor: object = None
    starts: list[int] = field(default_factory=list)
    users: list[int] = field(default_factory=list)
    latest: dict[str, tuple[int, int]] = field(default_factory=dict)


class Result(NamedTuple):
    """A tool result in a user message: its block, the call's tool and arguments, the file
    it reads (None: not a read) and its text."""

    block: int
    tool: object
    arguments: object
    key: str | None
    body: str


@dataclass(slots=True)
class Candidate:
    """One text block the batch may replace, and the tokens that saves."""

    index: int
    block: int
    edit_type: int
    kind: str  # "mask"
    replacement: str
    saved: int


def _stub(notice_tool: object, arguments: object, tokens: int) -> str:
    if isinstance(arguments, str):
        shown = arguments
    else:
        try:
            shown = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False, default=repr)
        except (TypeError, ValueError):
            shown = repr(arguments)
    if len(shown) > STUB_ARGS:
        shown = shown[: STUB_ARGS - 3] + "..."
    return (
        f"[ctxwin] The result of {notice_tool}({shown}) was removed to save context "
        f"({tokens} tokens); call the tool again if it is needed."
    )


class PlannerMemory(Protocol):
    """What the planner keeps on a task between decisions (``AutoMemory`` has it)."""

    block_tokens: dict[tuple[int, int], tuple[Message, int]]
    stub_tokens: dict[str, int]
    results: dict[int, tuple[Message, list[Result]]]
    facts: HistoryFacts


class PlannedTask(Protocol):
    """What the planner uses of a task's state (``TaskState`` has it)."""

    @property
    def auto(self) -> PlannerMemory:
        """What ``auto`` keeps on the task between requests."""
        ...

    @property
    def overlay(self) -> Overlay:
        """The task's edits."""
        ...

    @property
    def dialect(self) -> Dialect:
        """The task's message dialect."""
        ...

    @property
    def reads(self) -> ReadRules | None:
        """The read tools a native dialect counts."""
        ...

    @property
    def summary(self) -> Summary | None:
        """The summary the view carries."""
        ...

    @property
    def deleted_range(self) -> list[int] | None:
        """The inclusive ``[2, end]`` range of messages not sent, or None."""
        ...

    @property
    def dropped(self) -> tuple[tuple[int, int], ...]:
        """The deleted set's ranges."""
        ...

    def truncated_messages(self, messages: Sequence[Message]) -> list[Message]:
        """The view of ``messages``."""
        ...


Task = TypeVar("Task", bound=PlannedTask, covariant=True)
"""The state a planner is given (its caller may use more of it than the planner does)."""


class Planner(Generic[Task]):
    """One decision: the task's history, view and counts, shared by the steps."""

    def __init__(
        self,
        state: Task,
        messages: Sequence[Message],
        budgeting: Budgeting,
        sheet: PriceSheet | None,
        policy: AutoPolicy,
        ts: int,
    ) -> None:
        self.state = state
        self.messages = messages
        self.budgeting = budgeting
        self.sheet = sheet or DECISION_SHEET
        self.policy = policy
        self.ts = ts
        self._view: tuple[Any, list[Message]] | None = None

    # -- sizes ------------------------------------------------------------------

    def current(self, index: int) -> Message:
        """History message ``index`` with its overlay applied."""
        entry = self.state.overlay.get(index)
        message = self.messages[index]
        return message if entry is None else apply_overlay(message, entry)

    def text_tokens(self, text: str) -> int:
        return self.budgeting.count({"role": "user", "content": [{"type": "text", "text": text}]})

    def block_tokens(self, index: int, block: int, text: str) -> int:
        """Tokens of one block's text in the history, remembered while the message is the same."""
        key = (index, block)
        held = self.state.auto.block_tokens.get(key)
        message = self.messages[index]
        if held is not None and held[0] is message:
            return held[1]
        tokens = self.text_tokens(text)
        self.state.auto.block_tokens[key] = (message, tokens)
        return tokens

    def view(self) -> list[Message]:
        """The view as the state stands (built again only after an edit or a cut)."""
        state = self.state
        key = (state.overlay.version, len(state.overlay), state.deleted_range, state.dropped)
        if self._view is None or self._view[0] != key:
            self._view = (key, state.truncated_messages(self.messages))
        return self._view[1]

    def view_tokens(self) -> int:
        return self.budgeting.view_tokens(self.view())

    def origins(self) -> list[int]:
        """The history index of each position of :meth:`view`."""
        state = self.state
        return view_origins(len(self.messages), state.deleted_range, state.dropped)

    def tail_tokens(self, first: int) -> int:
        """Calibrated tokens of the view from history index ``first`` to the end."""
        view = self.view()
        place = bisect.bisect_left(self.origins(), first) if len(view) > 2 else 0
        total = sum(self.budgeting.count(message) for message in view[place:])
        return round(total * self.budgeting.ratio)

    def stub_tokens(self, text: str) -> int:
        """Tokens of a replacement text, remembered (stubs repeat every turn)."""
        held = self.state.auto.stub_tokens.get(text)
        if held is None:
            if len(self.state.auto.stub_tokens) > 4096:
                self.state.auto.stub_tokens.clear()
            held = self.state.auto.stub_tokens[text] = self.text_tokens(text)
        return held

    # -- what the history holds -------------------------------------------------

    def results_at(self, index: int) -> list[Result]:
        """The tool results message ``index`` holds, remembered while it is the same."""
        held = self.state.auto.results.get(index)
        message = self.messages[index]
        if held is not None and held[0] is message:
            return held[1]
        found = self._results_at(index)
        self.state.auto.results[index] = (message, found)
        return found

    def _results_at(self, index: int) -> list[Result]:
        messages = self.messages
        message = messages[index]
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list) or not content:
            return []
        if not self.state.dialect.native:  # SPEC.md's text results: a header names the tool
            text = text_of(content[0]) or ""
            header = TOOL_HEADER.match(text) if text.startswith("[") else None
            if header is None:
                return []
            block = 0 if len(text) > header.end() else 1
            body = text if block == 0 else (text_of(content[1]) if len(content) > 1 else None)
            if not body:
                return []
            tool, path = header.group(1), header.group(2)
            key = path if tool == "read_file" else None
            return [Result(block, tool, path, key, body)]
        rules = self.state.reads
        assert rules is not None  # a native dialect's task has its read rules
        reads = {block: key for key, block in native_reads(messages, index, rules)}
        calls: dict[str, tuple[object, object]] | None = None
        found: list[Result] = []
        for block_index, item in enumerate(content):
            if item.get("type") != "tool_result":
                continue
            body = text_of(item)
            if not body:
                continue
            if calls is None:
                calls = tool_calls(messages[index - 1]) if index else {}
            name, arguments = calls.get(item.get("tool_use_id", ""), ("tool", None))
            found.append(Result(block_index, name, arguments, reads.get(block_index), body))
        return found

    def facts(self) -> HistoryFacts:
        """Where turns begin, the user messages and each file's latest read, over the whole
        history: kept by the task and extended by what the history added since (made again
        when its known part is not the same)."""
        messages = self.messages
        held = self.state.auto.facts
        seen = held.seen
        if seen > len(messages) or (seen and messages[seen - 1] is not held.anchor):
            held = self.state.auto.facts = HistoryFacts()
            seen = 0
        for index in range(seen, len(messages)):
            role = messages[index].get("role")
            if role == "user":
                held.users.append(index)
                for result in self.results_at(index):
                    if result.key is not None:
                        held.latest[result.key] = (index, result.block)
            elif role == "assistant" and index >= 3 and messages[index - 1].get("role") == "user":
                held.starts.append(index)
        if messages:
            held.seen, held.anchor = len(messages), messages[-1]
        return held

    def turn_starts(self, first: int) -> list[int]:
        """History indices from ``first`` on where a turn begins: an assistant message after a
        user message. A turn runs to the next one's start, so dropping whole turns keeps every
        call with its results and the message before a dropped run a user message."""
        starts = self.facts().starts
        return starts[bisect.bisect_left(starts, first) :]

    def latest_reads(self, first: int) -> dict[str, tuple[int, int]]:
        """Each file's latest read from ``first`` on: ``(index, block)`` by file."""
        latest = self.facts().latest
        return {key: at for key, at in latest.items() if at[0] >= first}

    # -- the rolling mask -------------------------------------------------------------

    def mask_candidates(self, first: int, end: int, latest: Mapping[str, Any]) -> list[Candidate]:
        """Stubs for the results of user messages ``first <= i < end`` (the turns that just
        left the recent window): never the latest read of a file, nor a result whose stub
        costs more to write than the result costs to read once from the cache."""
        overlay = self.state.overlay
        dropped = self.state.dropped
        out: list[Candidate] = []
        for index in range(max(first, 2), end):
            if any(low <= index <= high for low, high in dropped):
                continue
            entry = overlay.get(index)
            for result in self.results_at(index):
                if entry is not None and result.block in entry.blocks:
                    continue
                if result.key is not None and latest.get(result.key) == (index, result.block):
                    continue
                tokens = self.block_tokens(index, result.block, result.body)
                replacement = _stub(result.tool, result.arguments, tokens)
                if not self.state.dialect.native:
                    if result.block == 0:
                        header = TOOL_HEADER.match(result.body)
                        assert header is not None
                        replacement = f"{header.group(0)}\n{replacement}"
                    # What a person typed in the result (an answer, feedback) stays.
                    typed = "\n".join(typed_parts(result.body))
                    replacement += f"\n{typed}" if typed else ""
                stub = self.stub_tokens(replacement)
                if tokens * self.sheet.cache_read < stub * self.sheet.cache_write:
                    continue
                out.append(
                    Candidate(
                        index, result.block, EDIT_NO_FILE_READ, "mask", replacement, tokens - stub
                    )
                )
        return out

    # -- the ledger -------------------------------------------------------------------

    def ledger_text(self, gone: Sequence[int], budget: int) -> str:
        """The task ledger (:func:`~._task_ledger.task_ledger`) of the history messages
        ``gone``, at most ``budget`` tokens: what a person typed, a line per call, the files."""
        if not gone:
            return ""
        return task_ledger(self.messages, gone, budget, self.text_tokens, self.state.reads)

    def ledger_estimate(self, total: float) -> float:
        """Tokens the ledger will take after a rebuild: the one carried now, or a floor."""
        carried = self.state.summary
        if carried is None:
            return min(LEDGER_FLOOR, total)
        return float(self.stub_tokens(carried.text))

    def apply(self, batch: Sequence[Candidate], rewrite: int) -> Receipt:
        """Put the candidates' stubs in the overlay; ``rewrite``: tokens written again."""
        overlay = self.state.overlay
        for candidate in batch:
            overlay.append(
                candidate.index,
                candidate.edit_type,
                candidate.block,
                [self.ts, "text", [candidate.replacement], []],
            )
        saved = sum(candidate.saved for candidate in batch)
        first = min(candidate.index for candidate in batch)
        return Receipt(
            self.ts, "mask", first, saved, rewrite, payback_turns(self.sheet, saved, rewrite)
        )

    def shorten(self, limit: float, target: float) -> list[Receipt]:
        """Shorten the view's text blocks larger than ``limit`` tokens to ``target`` tokens."""
        receipts: list[Receipt] = []
        for index in self.origins():
            message = self.current(index)
            if self.budgeting.tokens(message) <= limit:
                continue
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for block_index, block in enumerate(content):
                text = text_of(block)
                if not text:
                    continue
                tokens = self.text_tokens(text)
                if tokens * self.budgeting.ratio <= limit:
                    continue
                keep = max(int(len(text) * target / (tokens * self.budgeting.ratio)), 200)
                if keep >= len(text):
                    continue
                head = text[: keep * 2 // 3]
                tail = text[len(text) - keep // 3 :]
                removed = tokens - round(tokens * keep / len(text))
                shortened = (
                    f"{head}\n[ctxwin] This content was shortened to fit the model's context "
                    f"window: it held {tokens} tokens, about {removed} were removed from "
                    f"the middle.\n{tail}"
                )
                edit_type = EDIT_UNDEFINED if index < 2 else EDIT_NO_FILE_READ
                self.state.overlay.append(
                    index, edit_type, block_index, [self.ts, "text", [shortened], []]
                )
                saved = tokens - self.text_tokens(shortened)
                rewrite = self.tail_tokens(index)
                receipts.append(
                    Receipt(
                        self.ts,
                        "shorten",
                        index,
                        saved,
                        rewrite,
                        payback_turns(self.sheet, saved, rewrite),
                    )
                )
        return receipts
