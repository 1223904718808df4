"""Prefix digests of a conversation, for sending only what a turn adds.

A chained digest identifies every prefix of a history:
``D[0]`` is 16 zero bytes and ``D[n] = H(D[n-1] || h(message n))``, where ``h``
and ``H`` are BLAKE2b with a 16-byte digest and ``h`` reads the message's
canonical msgpack encoding (:func:`ctxwin.proto.pack`: smallest integer forms,
floats as float64, map keys in their given order). A caller that sends
``base``/``base_digest``/``append`` instead of the whole list proves that its
first ``base`` messages are the ones the daemon already holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from ._codec import pack

DIGEST_SIZE = 16
EMPTY_DIGEST = bytes(DIGEST_SIZE)


def message_digest(message: Mapping[str, Any]) -> bytes:
    """``h(message)``: BLAKE2b-128 of the message's canonical msgpack encoding."""
    return hashlib.blake2b(pack(message), digest_size=DIGEST_SIZE).digest()


def chain_digest(previous: bytes, message_hash: bytes) -> bytes:
    """``H(previous || h(message))``: the digest of a prefix one message longer."""
    return hashlib.blake2b(previous + message_hash, digest_size=DIGEST_SIZE).digest()


class DigestChain:
    """The prefix digests of a history that grows at the end and may be cut back.

    ``digest(n)`` is ``D[n]`` for ``0 <= n <= len(self)``.
    """

    __slots__ = ("_prefix",)

    def __init__(self, messages: Iterable[Mapping[str, Any]] = ()) -> None:
        self._prefix = [EMPTY_DIGEST]
        self.extend(messages)

    def __len__(self) -> int:
        """How many messages the chain covers."""
        return len(self._prefix) - 1

    def digest(self, length: int) -> bytes:
        """``D[length]``.

        Raises:
            IndexError: when ``length`` is negative or past the end.
        """
        if not 0 <= length < len(self._prefix):
            raise IndexError(f"no prefix of length {length} (chain covers {len(self)})")
        return self._prefix[length]

    def matches(self, length: int, digest: object) -> bool:
        """Whether the prefix of ``length`` messages has ``digest``."""
        return 0 <= length < len(self._prefix) and self._prefix[length] == digest

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Append messages at the end."""
        last = self._prefix[-1]
        for message in messages:
            last = chain_digest(last, message_digest(message))
            self._prefix.append(last)

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` messages."""
        del self._prefix[length + 1 :]
