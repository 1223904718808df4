"""The columns of docs/COST.md beyond cost: what a view keeps, feasibility, dominance.

Every measure here reads the internal form (the engine's messages, as the
replay in :mod:`bench.strategies` holds them) and is computed once per
message object where it can be: a view is mostly the history's own message
objects, so a view costs what is new in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ctxwin.engine import user_instructions

Message = dict[str, Any]

SNIPPET_CHARS = 160
"""What of an instruction or a call's key argument is looked for (docs/COST.md)."""

KEY_ARGUMENTS = (
    "file_path",
    "path",
    "notebook_path",
    "command",
    "cmd",
    "pattern",
    "regex",
    "query",
    "url",
)
"""A call's key argument: the first of these its arguments hold as a string (or argv list)."""

SKIPPED_KEYS = frozenset({"type", "id", "tool_use_id", "role", "signature", "data", "media_type"})
"""Keys whose strings are no text of the view (ids, signatures, image data)."""


def normalised(text: str) -> str:
    """``text`` with every run of white space one space, and none at either end."""
    return " ".join(text.split())


def snippet(text: str) -> str:
    """What is looked for of ``text``: its first 160 characters, spaces normalised."""
    return normalised(text)[:SNIPPET_CHARS]


def typed_texts(message: Message, dialect: str) -> list[str]:
    """What a person typed in ``message`` (docs/COST.md, "Instructions kept").

    The engine's one definition, the one its task ledger lists
    (:func:`ctxwin.engine.user_instructions`): in the Cline dialect the text
    inside ``<task>``, ``<feedback>``, ``<user_message>`` and ``<answer>``; in
    the others a user message's texts that are not system text (text that
    opens with ``<``). Tool results are never typed.
    """
    return user_instructions(message, dialect == "cline")


def instructions(history: Sequence[Message], dialect: str) -> list[tuple[int, str]]:
    """Each distinct instruction's snippet with the index of the message that first typed it."""
    seen: dict[str, int] = {}
    for index, message in enumerate(history):
        for text in typed_texts(message, dialect):
            found = snippet(text)
            if found and found not in seen:
                seen[found] = index
    return [(index, text) for text, index in seen.items()]


def key_argument(arguments: object) -> str | None:
    """A call's key argument (a path, a command, a pattern, a query) as a snippet, or None.

    An argv list counts by its longest element (``["bash", "-lc", "cat a"]``
    by ``cat a``): that is the string a view or a ledger line holds.
    """
    if not isinstance(arguments, Mapping):
        return None
    for name in KEY_ARGUMENTS:
        value = arguments.get(name)
        if isinstance(value, list):
            strings = [item for item in value if isinstance(item, str)]
            value = max(strings, key=len) if strings else None
        if isinstance(value, str) and (found := snippet(value)):
            return found
    return None


def calls(history: Sequence[Message]) -> list[tuple[int, str]]:
    """Each call the agent made that has a key argument: (message index, key snippet)."""
    found: list[tuple[int, str]] = []
    for index, message in enumerate(history):
        content = message.get("content")
        if message.get("role") != "assistant" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                key = key_argument(block.get("input"))
                if key is not None:
                    found.append((index, key))
    return found


def strings_of(value: object, out: list[str]) -> None:
    """Append every string ``value`` holds (ids, signatures and image data aside) to ``out``."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key not in SKIPPED_KEYS:
                strings_of(item, out)
    elif isinstance(value, list):
        for item in value:
            strings_of(item, out)


class Finder:
    """Which of a fixed list of needles each message's strings hold, once per message object.

    Needles are snippets (normalised); a message's strings are normalised
    the same way before they are searched, so a needle is found whatever
    the white space around it.
    """

    def __init__(self, needles: Sequence[str]) -> None:
        self.needles = list(needles)
        self._held: dict[int, tuple[Message, frozenset[int]]] = {}

    def found(self, message: Message) -> frozenset[int]:
        """The indices of the needles found among ``message``'s strings."""
        held = self._held.get(id(message))
        if held is not None and held[0] is message:
            return held[1]
        strings: list[str] = []
        strings_of(message.get("content"), strings)
        text = "\n".join(normalised(item) for item in strings)
        found = frozenset(i for i, needle in enumerate(self.needles) if needle in text)
        self._held[id(message)] = (message, found)
        return found

    def in_view(self, view: Iterable[Message]) -> set[int]:
        """The indices of the needles found in any message of ``view``."""
        found: set[int] = set()
        for message in view:
            found.update(self.found(message))
        return found


def share_present(origins: Sequence[int], length: int, found: set[int]) -> float | None:
    """Of the needles whose origin is before ``length``, the share in ``found``; None for none.

    ``origins[i]`` is the history index needle ``i`` comes from.
    """
    due = [i for i, origin in enumerate(origins) if origin < length]
    if not due:
        return None
    return sum(1 for i in due if i in found) / len(due)


@dataclass(slots=True)
class Kept:
    """A share measured on every request: its mean and its worst request."""

    total: float = 0.0
    count: int = 0
    worst: float = 1.0

    def add(self, share: float | None) -> None:
        """Count one request's share (None: nothing was due yet)."""
        if share is None:
            return
        self.total += share
        self.count += 1
        self.worst = min(self.worst, share)

    @property
    def mean(self) -> float:
        """The mean over the requests counted (1.0 when none was)."""
        return self.total / self.count if self.count else 1.0


def feasible(over: int, refused: int, strict_refused: int, dialect: str) -> bool:
    """Whether a strategy is feasible on a conversation and window (docs/COST.md).

    Every request fits, the strategy adds no refused view, and in the Cline
    dialect (whose histories answer calls with text) a strict provider takes
    every view as it is. In the other dialects what the history itself does
    wrong is not the strategy's: only what it adds counts.
    """
    return over == 0 and refused == 0 and (dialect != "cline" or strict_refused == 0)


READS_SLACK = 0.01
"""A point of the latest-reads share: the slack of dominance and of the reads goal."""


def dominating(
    subject: Mapping[str, Any], others: Iterable[Mapping[str, Any]], unit: str
) -> list[str]:
    """The feasible alternatives that dominate ``subject`` under ``unit``'s sheet.

    Rows carry ``strategy``, ``feasible``, ``cost_<unit>`` and
    ``latest_read_kept``; an alternative dominates when it is feasible,
    costs less and keeps at least as many latest reads, less one point.
    """
    return [
        str(other["strategy"])
        for other in others
        if other["strategy"] != subject["strategy"]
        and other["feasible"]
        and other[f"cost_{unit}"] < subject[f"cost_{unit}"]
        and other["latest_read_kept"] >= subject["latest_read_kept"] - READS_SLACK
    ]
