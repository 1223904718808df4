"""Prompt-cache hints for the providers' APIs (docs/PRICING.md, "What the adapters send").

ctxwin's cost model counts as read from the cache the leading messages of a
view that the previous view of the task also began with; the rest is
written (docs/COST.md). The adapters make the providers cache that prefix:

- Anthropic caches only up to ``cache_control`` breakpoints, at most 4 a
  request; a breakpoint reads the longest prefix cached before (checking the
  block boundaries up to about 20 blocks before it) and writes the prefix up
  to itself (https://platform.claude.com/en/docs/build-with-claude/prompt-caching).
  :class:`Breakpoints` puts one on the last block of the last message (what
  the next request reads), one where the longest prefix this conversation
  wrote before ends (read exactly, however many blocks came after it), and one
  at the end of the first pair (what a rebuilt view keeps).
- OpenAI caches prefixes of 1,024 tokens or more by itself and routes a
  request by a hash of its first tokens and its ``prompt_cache_key``
  (https://platform.openai.com/docs/guides/prompt-caching): a task's
  requests carry one key (:func:`prompt_cache_key`), so they meet the
  machine that holds their prefix.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAX_BREAKPOINTS", "Breakpoints", "count_breakpoints", "prompt_cache_key"]

MAX_BREAKPOINTS = 4
"""Anthropic's limit of ``cache_control`` breakpoints in one request."""

EPHEMERAL = {"type": "ephemeral"}
"""The 5-minute cache the cost model's Anthropic sheet prices (1.25 written, 0.1 read)."""

UNMARKABLE = frozenset({"thinking", "redacted_thinking"})
"""Blocks the API takes no ``cache_control`` on."""

REMEMBERED = 64
"""Prefixes written that a conversation remembers (the cache keeps them 5 minutes)."""

HEAD = 2
"""Messages of the first pair: what a rebuilt or cut view keeps at its start."""


def prompt_cache_key(task: str) -> str:
    """The ``prompt_cache_key`` of a task's requests: stable, short, and not the task id itself."""
    return "ctxwin-" + hashlib.sha256(task.encode()).hexdigest()[:24]


def count_breakpoints(value: object) -> int:
    """The ``cache_control`` markers in a request part (system, tools or messages)."""
    if isinstance(value, Mapping):
        own = 1 if value.get("cache_control") is not None else 0
        return own + sum(
            count_breakpoints(item) for key, item in value.items() if key != "cache_control"
        )
    if isinstance(value, list | tuple):
        return sum(count_breakpoints(item) for item in value)
    return 0


def _unmarked(value: object) -> object:
    """``value`` without its ``cache_control`` keys (a breakpoint is no part of the prefix)."""
    if isinstance(value, Mapping):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list | tuple):
        return [_unmarked(item) for item in value]
    return value


def _prefixes(view: Sequence[Any], system: object, tools: object) -> list[str]:
    """``out[p]``: a digest of the request's prefix up to the end of message ``p - 1``
    (tools and system first, as the API renders them)."""
    running = hashlib.sha256()
    running.update(json.dumps(_unmarked([tools, system]), sort_keys=True, default=str).encode())
    out = [running.hexdigest()]
    for message in view:
        running.update(json.dumps(_unmarked(message), sort_keys=True, default=str).encode())
        out.append(running.hexdigest())
    return out


def _longhand(message: Any) -> Any:
    """``message`` with string content as one text block (a breakpoint needs a block, and a
    message must be sent the same way marked or not, for its prefix to stay the same)."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, str) and content:
        return {**message, "content": [{"type": "text", "text": content}]}
    return message


def _last_markable(message: Mapping[str, Any]) -> int | None:
    """The index of the message's last block that can carry a breakpoint."""
    content = message.get("content")
    if not isinstance(content, list):
        return None
    for index in range(len(content) - 1, -1, -1):
        block = content[index]
        if not isinstance(block, Mapping) or block.get("type") in UNMARKABLE:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue  # the API refuses a breakpoint on an empty text
        return index
    return None


def _marked(message: Mapping[str, Any], block: int) -> dict[str, Any]:
    """A copy of ``message`` whose block ``block`` carries a breakpoint (the original as it was)."""
    blocks = list(message["content"])
    blocks[block] = {**blocks[block], "cache_control": EPHEMERAL}
    return {**message, "content": blocks}


class Breakpoints:
    """Where one Anthropic conversation's breakpoints go, request after request.

    It remembers the prefixes its requests wrote (a digest of each prefix
    that ended at a breakpoint of a request the API answered).
    """

    def __init__(self) -> None:
        self._written: OrderedDict[str, None] = OrderedDict()

    def place(
        self, view: Sequence[Any], system: object = None, tools: object = None
    ) -> tuple[list[Any], list[str]]:
        """The view to send, with breakpoints, and the prefixes they write.

        Breakpoints, in this order while the 4 last (fewer when the caller's
        system, tools or messages hold some of their own): the last block of
        the last message; the end of the longest prefix written before that
        this view begins with; the end of the first pair. A message none of
        whose blocks can carry one (only thinking) gets none. Messages whose
        content is a string are sent as one text block, marked or not.
        """
        room = MAX_BREAKPOINTS - count_breakpoints([system, tools, list(view)])
        if room <= 0 or not view:
            return list(view), []
        view = [_longhand(message) for message in view]
        digests = _prefixes(view, system, tools)
        wanted = [len(view)]
        earlier = [p for p in range(1, len(view)) if digests[p] in self._written]
        if earlier:
            wanted.append(earlier[-1])
        if len(view) > HEAD:
            wanted.append(HEAD)
        marked, written = list(view), []
        for end in dict.fromkeys(wanted):
            if room == 0:
                break
            block = _last_markable(marked[end - 1])
            if block is None:
                continue
            marked[end - 1] = _marked(marked[end - 1], block)
            written.append(digests[end])
            room -= 1
        return marked, written

    def sent(self, written: Sequence[str]) -> None:
        """The API answered a request that wrote these prefixes: they can be read from now on."""
        for digest in written:
            self._written[digest] = None
            self._written.move_to_end(digest)
        while len(self._written) > REMEMBERED:
            self._written.popitem(last=False)
