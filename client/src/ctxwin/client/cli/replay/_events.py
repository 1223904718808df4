"""What a view no longer sends, counted: the tokens of messages and texts (the daemon's
``count_tokens``), and the truncation and optimisation events of a turn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ctxwin.proto import CLINE, DeletedRange

from ..._sync import Client
from ._report import ReplayEvent, TokenCounts
from ._views import NOTICE_EDIT, Overlay, Sources, Variant, ViewState, original_text


def count_tokens(
    client: Client, messages: Sequence[Mapping[str, Any]], dialect: str = CLINE
) -> int:
    """Tokens of ``messages`` in their dialect, by the daemon's ``count_tokens``."""
    return counted(client, messages, dialect)[0]


def counted(
    client: Client, messages: Sequence[Mapping[str, Any]], dialect: str = CLINE
) -> tuple[int, dict[str, int]]:
    """Tokens of ``messages`` in their dialect, by the daemon's ``count_tokens``, and the
    part types it did not recognise (counted by the text they hold) with how many parts of
    each."""
    if not messages:
        return 0, {}
    if dialect == CLINE:
        result = client.count_tokens(list(messages))
    else:
        result = client.count_tokens(list(messages), dialect=dialect)
    found = result.get("unrecognised") or {}
    return result["tokens"], {str(kind): int(number) for kind, number in found.items()}


def cut_from_view(
    history: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    before: ViewState | None,
    after: ViewState,
    end: int,
) -> tuple[list[int], list[Mapping[str, Any]]]:
    """What a native view's cut removed: the history indices of the messages the view
    ``before`` sent (as they are or rebuilt) that the view ``after``, of the history's
    first ``end`` messages, neither sends nor rebuilds, and those messages as ``before``
    sent them, in its order.

    A message only rebuilt by ``after`` (the notice put in it, a repaired pair) is still
    sent and not named; a message ``before`` added (a filled-in result) stands for no
    history message and is not counted. Before the first view (``before`` None) nothing
    was sent.
    """
    if before is None or before.order is None:
        return [], []
    gone = set(after.removed(end))
    removed: list[Mapping[str, Any]] = []
    named: set[int] = set()
    for index, number in before.order:
        if index not in gone:
            continue
        if number is None:
            removed.append(history[index])
        elif not variants[number].added:
            removed.append(variants[number].message)
        else:
            continue
        named.add(index)
    return sorted(named), removed


def count_text(client: Client, text: str) -> int:
    """Tokens of a text, by the daemon's ``count_tokens``."""
    return client.count_tokens(text=text)["tokens"] if text else 0


def optimisation(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    before: Overlay,
    after: Overlay,
    turn: int,
    end: int,
    deleted_range: DeletedRange,
    sources: Sources | None = None,
) -> ReplayEvent | None:
    """The optimisation event of a turn: blocks whose latest update is new (notices excluded).

    ``sources``: for a dialect other than ``cline``, where each overlay key
    (internal indices) came from in the history, and its text before any edit.
    """
    old_texts: list[str] = []
    new_texts: list[str] = []
    touched: set[int] = set()
    visible_from = deleted_range[1] + 1 if deleted_range else 2
    for (index, block), (edit_type, texts) in after.items():
        known = before.get((index, block), (edit_type, []))[1]
        if edit_type == NOTICE_EDIT or len(texts) <= len(known) or not texts:
            continue
        if 2 <= index < visible_from:
            continue  # hidden by this turn's range: its truncation event counts it
        at, original = index, None
        if sources is not None:
            if (index, block) not in sources:
                continue  # the daemon holds no history to name it by
            at, original = sources[index, block]
        if known:
            previous_text = known[-1]
        elif original is not None:
            previous_text = original
        else:
            previous_text = original_text(history, index, block) or ""
        old_texts.append(previous_text)
        new_texts.append(texts[-1])
        touched.add(at)
    if not touched:
        return None
    old, new = "\n".join(old_texts), "\n".join(new_texts)
    return ReplayEvent(
        turn=turn,
        message=end,
        kind="optimisation",
        deleted_range=deleted_range,
        removed_messages=0,
        messages=sorted(touched),
        chars_saved=len(old) - len(new),
        tokens_saved=count_text(client, old) - count_text(client, new),
    )


def message_tokens(
    client: Client,
    history: Sequence[Mapping[str, Any]],
    variants: Sequence[Variant],
    dialect: str = CLINE,
) -> TokenCounts:
    """Count every message of ``history`` and every variant, one message at a time (with the
    part types of the history the daemon did not recognise)."""
    tokens: list[int] = []
    unrecognised: dict[str, int] = {}
    for message in history:
        count, found = counted(client, [message], dialect)
        tokens.append(count)
        for kind, number in found.items():
            unrecognised[kind] = unrecognised.get(kind, 0) + number
    return TokenCounts(
        tokens,
        [count_tokens(client, [variant.message], dialect) for variant in variants],
        unrecognised,
    )
