"""What a message dialect is: the interface each dialect implements, and the Cline dialect.

Every task has a :class:`Dialect`. :class:`ClineDialect` (SPEC.md's) is the
identity: its history is the engine's internal form itself. A native dialect
(``_dialect_<name>.py``) maps each of its messages into internal blocks that
remember where they came from (:data:`SRC`, :data:`PART`, made by
:func:`block`) and rebuilds changed ones; :class:`~._mapped.MappedHistory`
keeps a history of it in the internal form (docs/DIALECTS.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from ctxwin.proto import CLINE

from ._blocks import Block, Message

SRC = "_src"
"""Key of an internal block: the history index of the message it came from."""
PART = "_part"
"""Key of an internal block: which part of that message it stands for (per dialect)."""
USER = "user"
ASSISTANT = "assistant"


class DialectError(ValueError):
    """A history the task's dialect cannot carry; the message names the place (``messages[3]``)."""


class Mapped(NamedTuple):
    """One message of a dialect in the internal form (a tuple: made for every message).

    Attributes:
        role: ``user`` or ``assistant``; None for a kept-out message (system).
        blocks: the internal blocks, each with :data:`SRC` and :data:`PART`.
        calls: whether it holds tool calls (see :attr:`Dialect.calls_end_turn`).
    """

    role: str | None
    blocks: list[Block]
    calls: bool = False


KEPT_OUT = Mapped(None, [])


class MappedLike(Protocol):
    """What a dialect reads and writes of the history it maps (``_mapped.MappedHistory``
    has it; declared here so that a dialect needs nothing above it).

    Attributes:
        source: the dialect's messages, as the caller sent them.
        mapped: each of them in the internal form.
        internal: the internal list the engine runs on.
        calls: tool call id -> (name, history index), filled in as calls are mapped.
    """

    source: list[Message]
    mapped: list[Mapped]
    internal: list[Message]
    calls: dict[str, tuple[str, int]]


class Dialect:
    """How one dialect's messages map to the internal form and back.

    Attributes:
        name: the dialect's wire name.
        field: the request field its history is named by in errors.
        native: its histories are mapped into the internal form
            (:class:`~._mapped.MappedHistory`) and their file reads are tool calls
            (``ReadRules``); false for :class:`ClineDialect`, whose history is
            the internal form itself, with Cline's text reads (SPEC.md).
        strict: results that answer no call of the message before are orphans
            wherever they stand, and the results a cut orphans are dropped
            after the overlay (an edit goes with its result) rather than
            before it as SPEC.md §4 step 3 says.
        calls_end_turn: a message with calls must be answered by the next
            message (OpenAI Chat, Gemini), so it ends its internal message.
        merges_calls: calls split over consecutive messages of one turn are sent
            as one message (OpenAI Chat: each message's calls must be answered
            right after it).
        new_inside: blocks the view adds (a missing result, a notice) go inside
            the neighbouring message (Anthropic, Gemini) rather than into
            messages of their own (OpenAI Chat, Responses).
    """

    name = ""
    field = "messages"
    native = True
    strict = True
    calls_end_turn = False
    new_inside = False
    merges_calls = False

    def map_message(self, message: Any, index: int, history: MappedLike) -> Mapped:
        """The internal form of history message ``index``.

        Raises:
            DialectError: the message is not one this dialect can carry; its
                text names the place within the message (``.content[2] must
                be a map``), which :class:`~._mapped.MappedHistory` puts after the
                message's own (``messages[7]``), so that a message that maps
                builds no place names.
        """
        raise NotImplementedError

    def rebuild(
        self, source: Message, index: int, role: str, blocks: list[Block], history: MappedLike
    ) -> list[Message]:
        """Message ``index`` rebuilt from what the view holds of it (changed or new blocks)."""
        raise NotImplementedError

    def fresh(self, role: str, blocks: list[Block], history: MappedLike) -> list[Message]:
        """Messages for blocks the view added (missing results, a notice)."""
        raise NotImplementedError

    def merged(self, out: list[tuple[int | None, Message]]) -> list[tuple[int | None, Message]]:
        """A rebuilt internal message's messages with the calls of consecutive ones in one
        (``merges_calls``): each keeps its history index, a merged one the first's."""
        return out

    def holds_results(self, message: Message) -> bool:
        """Whether ``message`` answers calls (no kept-out message may come before it)."""
        return False

    def joins(self, previous: Mapped, mapped: Mapped) -> bool:
        """Whether a message of the same role as the one before joins its internal message."""
        return not (self.calls_end_turn and previous.calls and mapped.role == ASSISTANT)


class ClineDialect(Dialect):
    """SPEC.md's dialect: the internal form itself (an identity mapping), with Cline's
    file reads given as text and orphan results dropped as SPEC.md §4 says."""

    name = CLINE
    native = False
    strict = False


CLINE_DIALECT = ClineDialect()
"""The Cline dialect, every task's until it names another."""


def block(kind: str, index: int, part: object, **fields: Any) -> Block:
    """An internal block of ``kind`` for part ``part`` of history message ``index``."""
    return {"type": kind, **fields, SRC: index, PART: part}


def originals(history: MappedLike, index: int) -> dict[object, Block]:
    """The internal blocks of message ``index`` by part."""
    return {item[PART]: item for item in history.mapped[index].blocks}
