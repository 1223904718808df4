"""The edits ``auto`` makes, each with its receipt (docs/STRATEGIES.md, docs/PRICING.md).

A :class:`Planner` holds one decision's history, view and counts: it finds
the candidates (file reads a later read supersedes, tool results to mask with
a stub), tells whether a batch pays back, applies it, cuts whole turns and
shortens what is too large. *When* each step is taken is ``_auto.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxwin.proto import PRICE_SHEETS, PriceSheet

from ._blocks import Message, text_of, tool_calls
from ._budget import Budgeting, fit_range
from ._cuts import add_truncation_notice, keep_newest
from ._ledger import Receipt, payback_turns
from ._optimize import TOOL_HEADER
from ._overlay import EDIT_NO_FILE_READ, EDIT_READ_FILE, EDIT_UNDEFINED
from ._reads import native_reads
from ._view import apply_overlay, keep_from

if TYPE_CHECKING:
    from ._auto import AutoPolicy
    from ._state import TaskState

__all__ = ["Candidate", "Planner"]

DECISION_SHEET = PRICE_SHEETS["anthropic"]
"""The sheet decisions assume when a task has none (its write premium is the highest)."""

STUB_ARGS = 160
"""Characters of a masked call's arguments kept in its stub."""


@dataclass(slots=True)
class Candidate:
    """One text block the batch may replace, and the tokens that saves."""

    index: int
    block: int
    edit_type: int
    kind: str  # "supersede" or "mask"
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


class Planner:
    """One decision: the task's history, view and counts, shared by the steps."""

    def __init__(
        self,
        state: TaskState,
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
        key = (self.state.overlay.version, len(self.state.overlay), self.state.deleted_range)
        if self._view is None or self._view[0] != key:
            self._view = (key, self.state.truncated_messages(self.messages))
        return self._view[1]

    def view_tokens(self) -> int:
        return self.budgeting.view_tokens(self.view())

    def tail_tokens(self, first: int) -> int:
        """Calibrated tokens of the view from history index ``first`` to the end."""
        start = keep_from(self.state.deleted_range)
        view = self.view()
        place = 2 + max(first - start, 0) if len(view) > 2 else 0
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

    # -- candidates -------------------------------------------------------------

    def candidates(self) -> list[Candidate]:
        """Superseded reads and old results after the range, oldest first."""
        messages = self.messages
        start = keep_from(self.state.deleted_range)
        policy = self.policy
        overlay = self.state.overlay
        notice = self.state.notices.duplicate_file_read
        user_seen = 0
        recent_from = len(messages)
        for index in range(len(messages) - 1, start - 1, -1):
            if messages[index].get("role") == "user":
                user_seen += 1
                if user_seen >= policy.recent_turns:
                    recent_from = index
                    break
        else:
            recent_from = start
        # Each result found: (index, block, tool, arguments, read key, text).
        found: list[tuple[int, int, object, object, str | None, str]] = []
        native, rules = self.state.dialect.native, self.state.reads
        for index in range(start, recent_from):
            message = messages[index]
            if message.get("role") != "user":
                continue
            content = message.get("content")
            if not isinstance(content, list) or not content:
                continue
            if not native:  # SPEC.md's text results: a header names the tool
                text = text_of(content[0]) or ""
                header = TOOL_HEADER.match(text) if text.startswith("[") else None
                if header is None:
                    continue
                block = 0 if len(text) > header.end() else 1
                body = text if block == 0 else (text_of(content[1]) if len(content) > 1 else None)
                if not body:
                    continue
                tool, path = header.group(1), header.group(2)
                key = path if tool == "read_file" else None
                found.append((index, block, tool, path, key, body))
                continue
            assert rules is not None  # a native dialect's task has its read rules
            reads = {block: key for key, block in native_reads(messages, index, rules)}
            calls: dict[str, tuple[object, object]] | None = None
            for block_index, item in enumerate(content):
                if item.get("type") != "tool_result":
                    continue
                body = text_of(item)
                if not body:
                    continue
                if calls is None:
                    calls = tool_calls(messages[index - 1]) if index else {}
                name, arguments = calls.get(item.get("tool_use_id", ""), ("tool", None))
                found.append((index, block_index, name, arguments, reads.get(block_index), body))
        # The latest read of each file, anywhere in the history, is never replaced.
        latest: dict[str, tuple[int, int]] = {}
        for index in range(start, len(messages)):
            for key, block in self._reads_at(index):
                latest[key] = (index, block)
        # The last ``keep_calls`` results, counting those of the last turns.
        newer = sum(self._results_at(index) for index in range(recent_from, len(messages)))
        spare = max(policy.keep_calls - newer, 0)
        recent_calls = {(index, block) for index, block, *_ in found[max(len(found) - spare, 0) :]}
        result: list[Candidate] = []
        for index, block, tool, arguments, key, body in found:
            entry = overlay.get(index)
            if entry is not None and block in entry.blocks:
                continue
            if key is not None and latest.get(key) == (index, block):
                continue
            tokens = self.block_tokens(index, block, body)
            if key is not None:
                replacement = notice
                kind, edit_type = "supersede", EDIT_READ_FILE
            else:
                if (index, block) in recent_calls and tokens < policy.large_result:
                    continue
                replacement = _stub(tool, arguments, tokens)
                kind, edit_type = "mask", EDIT_NO_FILE_READ
            if not native and block == 0:
                header = TOOL_HEADER.match(body)
                assert header is not None
                replacement = f"{header.group(0)}\n{replacement}"
            saved = tokens - self.stub_tokens(replacement)
            if saved > 0:
                result.append(Candidate(index, block, edit_type, kind, replacement, saved))
        return result

    def _reads_at(self, index: int) -> list[tuple[str, int]]:
        message = self.messages[index]
        if message.get("role") != "user":
            return []
        if self.state.dialect.native:
            rules = self.state.reads
            assert rules is not None  # a native dialect's task has its read rules
            return list(native_reads(self.messages, index, rules))
        content = message.get("content")
        if not isinstance(content, list) or not content:
            return []
        text = text_of(content[0]) or ""
        header = TOOL_HEADER.match(text) if text.startswith("[") else None
        if header is None or header.group(1) != "read_file":
            return []
        return [(header.group(2), 0 if len(text) > header.end() else 1)]

    def _results_at(self, index: int) -> int:
        """How many tool results message ``index`` holds."""
        message = self.messages[index]
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list) or not content:
            return 0
        if not self.state.dialect.native:
            text = text_of(content[0])
            return int(bool(text) and TOOL_HEADER.match(text or "") is not None)
        return sum(1 for block in content if block.get("type") == "tool_result")

    # -- steps ----------------------------------------------------------------------

    def pays_back(self, batch: Sequence[Candidate]) -> bool:
        saved = sum(candidate.saved for candidate in batch)
        if saved < self.policy.min_batch:
            return False
        first = min(candidate.index for candidate in batch)
        rewrite = self.tail_tokens(first)
        turns = payback_turns(self.sheet, saved, rewrite)
        if turns is None:
            return False
        low, high = self.policy.horizon
        users = sum(1 for message in self.messages if message.get("role") == "user")
        horizon = min(max(users, low), high)
        return turns * self.policy.margin <= horizon

    def apply(self, batch: Sequence[Candidate]) -> Receipt:
        first = min(candidate.index for candidate in batch)
        rewrite = self.tail_tokens(first)
        overlay = self.state.overlay
        for candidate in batch:
            overlay.append(
                candidate.index,
                candidate.edit_type,
                candidate.block,
                [self.ts, "text", [candidate.replacement], []],
            )
        saved = sum(candidate.saved for candidate in batch)
        kinds = sorted({candidate.kind for candidate in batch})
        return Receipt(
            self.ts,
            "+".join(kinds),
            first,
            saved,
            rewrite,
            payback_turns(self.sheet, saved, rewrite),
        )

    def cut(self, target: float) -> tuple[Receipt | None, bool]:
        """Cut whole turns down to ``target`` tokens; returns its receipt and whether it fits."""
        state = self.state
        before = state.deleted_range
        proposed, fits = fit_range(self.messages, before, state.overlay, target, self.budgeting)
        proposed = keep_newest(state, self.messages, before, proposed)
        if proposed == before or proposed is None:
            return None, fits
        start_before = keep_from(before)
        removed = self.view_tokens()
        state.deleted_range = proposed
        add_truncation_notice(state, self.ts, self.messages)
        removed -= self.view_tokens()
        rewrite = self.view_tokens()
        receipt = Receipt(
            self.ts,
            "cut",
            start_before,
            removed,
            rewrite,
            payback_turns(self.sheet, removed, rewrite),
        )
        return receipt, fits

    def shorten(self, limit: float, target: float) -> list[Receipt]:
        """Shorten the view's text blocks larger than ``limit`` tokens to ``target`` tokens."""
        receipts: list[Receipt] = []
        start = keep_from(self.state.deleted_range)
        indices = [*range(min(2, len(self.messages))), *range(start, len(self.messages))]
        for index in indices:
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
