"""Messages as plain maps for the wire, keeping the caller's objects where they already are."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Plain"]

_SCALARS = (str, int, float, bool, type(None), bytes)


def _is_plain(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, Mapping):
        return all(isinstance(key, str) and _is_plain(item) for key, item in value.items())
    if isinstance(value, list):
        return all(_is_plain(item) for item in value)
    return False


def _dump(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, Mapping):
        return {str(key): _dump(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_dump(item) for item in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # an SDK's pydantic object, e.g. a response's message or content block
        return dump(mode="json", exclude_none=True)
    return value  # left for the codec to refuse with a clear error


class Plain:
    """Turns a history into plain maps, once per message object.

    A message that is already plain (maps, lists, strings, numbers) is passed
    as the very object, so delta sync sees it unchanged. One that holds SDK
    objects (a response's ``message``, or ``{"role": "assistant", "content":
    response.content}``) is dumped; the dump is kept while the same object
    stands at the same position, so each is dumped once.
    """

    def __init__(self) -> None:
        self._memo: list[tuple[Any, Any]] = []

    def __call__(self, messages: Sequence[Any]) -> list[Any]:
        """The plain form of ``messages``."""
        memo = self._memo
        out: list[Any] = []
        for index, message in enumerate(messages):
            if index < len(memo) and memo[index][0] is message:
                out.append(memo[index][1])
            elif _is_plain(message):
                out.append(message)
            else:
                out.append(_dump(message))
        self._memo = list(zip(messages, out, strict=True))
        return out
