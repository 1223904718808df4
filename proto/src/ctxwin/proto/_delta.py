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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._codec import pack
from ._identity import first_other

DIGEST_SIZE = 16
EMPTY_DIGEST = bytes(DIGEST_SIZE)


def message_digest(message: Mapping[str, Any]) -> bytes:
    """``h(message)``: BLAKE2b-128 of the message's canonical msgpack encoding."""
    return hashlib.blake2b(pack(message), digest_size=DIGEST_SIZE).digest()


def chain_digest(previous: bytes, message_hash: bytes) -> bytes:
    """``H(previous || h(message))``: the digest of a prefix one message longer."""
    return hashlib.blake2b(previous + message_hash, digest_size=DIGEST_SIZE).digest()


class ChainTail:
    """Digests, sizes and encodings of messages that follow a chain's prefix (see ``following``)."""

    __slots__ = ("after", "encodings", "length", "prefix", "sizes")

    def __init__(self, length: int, after: bytes) -> None:
        self.length = length
        self.after = after  # D[length], which the tail continues
        self.prefix: list[bytes] = []
        self.sizes: list[int] = []
        self.encodings: list[bytes] = []


class DigestChain:
    """The prefix digests of a history that grows at the end and may be cut back.

    ``digest(n)`` is ``D[n]`` for ``0 <= n <= len(self)``; ``size(n)`` is the
    encoded size of those ``n`` messages, which tells a holder what its copy
    of the history weighs without walking it again.
    """

    __slots__ = ("_prefix", "_sizes")

    def __init__(self, messages: Iterable[Mapping[str, Any]] = ()) -> None:
        self._prefix = [EMPTY_DIGEST]
        self._sizes = [0]
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

    def size(self, length: int | None = None) -> int:
        """Bytes of the canonical encoding of the first ``length`` messages (all by default)."""
        return self._sizes[-1 if length is None else length]

    def matches(self, length: int, digest: object) -> bool:
        """Whether the prefix of ``length`` messages has ``digest``."""
        return 0 <= length < len(self._prefix) and self._prefix[length] == digest

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Append messages at the end."""
        self.adopt(len(self), self.following(len(self), messages))

    def following(self, length: int, messages: Iterable[Mapping[str, Any]]) -> ChainTail:
        """What ``messages`` add after the first ``length``; the chain itself is not changed.

        Raises:
            IndexError: when ``length`` is negative or past the end.
        """
        last = self.digest(length)
        size = self._sizes[length]
        tail = ChainTail(length, last)
        blake2b = hashlib.blake2b
        for message in messages:
            encoded = pack(message)
            message_hash = blake2b(encoded, digest_size=DIGEST_SIZE).digest()
            last = blake2b(last + message_hash, digest_size=DIGEST_SIZE).digest()
            size += len(encoded)
            tail.prefix.append(last)
            tail.sizes.append(size)
            tail.encodings.append(encoded)
        return tail

    def adopt(self, length: int, tail: ChainTail) -> None:
        """Keep the first ``length`` messages and append ``tail`` (made by :meth:`following`).

        Raises:
            ValueError: ``tail`` does not follow this chain's prefix of ``length``.
        """
        if tail.length != length or not self.matches(length, tail.after):
            raise ValueError("the tail does not follow this prefix")
        self.truncate(length)
        self._prefix.extend(tail.prefix)
        self._sizes.extend(tail.sizes)

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` messages."""
        del self._prefix[length + 1 :]
        del self._sizes[length + 1 :]


RECHECKED_TAIL = 2
"""Messages at the end of the last sync that are checked again even when identical objects."""


class DeltaSender:
    """A client's record of what it last sent the daemon for one task.

    It turns each call's full history into the smallest request the daemon can
    check: ``{"base", "base_digest", "append"}`` when a prefix was sent
    before, else ``{"messages"}``. Messages already sent are taken as
    unchanged when they are the very same objects, except the last
    :data:`RECHECKED_TAIL` of the previous sync, whose encodings are compared
    again with the ones sent (agents edit the newest message in place); a
    caller that edits older messages in place calls :meth:`reset`.

    Each message sent is hashed once: :meth:`prepare`, called while the reply
    is awaited, hashes what a request adds, and :meth:`sent` adopts it.
    """

    __slots__ = ("_chain", "_pending", "_sent", "_tail")

    def __init__(self) -> None:
        self._chain = DigestChain()
        self._sent: list[Any] = []
        # The encodings of the last RECHECKED_TAIL messages of _sent, as sent.
        self._tail: list[bytes] = []
        self._pending: tuple[Mapping[str, Any], Sequence[Any], ChainTail] | None = None

    def reset(self) -> None:
        """Forget what was sent: the next call sends the whole list."""
        self._chain = DigestChain()
        self._sent = []
        self._tail = []
        self._pending = None

    def _common_prefix(self, messages: Sequence[Any]) -> int:
        limit = min(len(self._sent), len(messages))
        trusted = max(min(limit, len(self._sent) - RECHECKED_TAIL), 0)
        # The first message that is not the very object sent. Identity, not
        # equality: an equal message may encode differently (1 and 1.0, key
        # order), and the daemon must hold what the caller holds.
        common = first_other(messages, self._sent, stop=trusted)
        tail_start = len(self._sent) - len(self._tail)
        while common < limit:
            if common >= tail_start:
                # Its digest follows from its encoding: the same bytes, the same digest.
                if pack(messages[common]) != self._tail[common - tail_start]:
                    break
            elif chain_digest(self._chain.digest(common), message_digest(messages[common])) != (
                self._chain.digest(common + 1)
            ):
                break
            common += 1
        return common

    def args_for(self, messages: Sequence[Any]) -> dict[str, Any]:
        """The history part of a request's args for ``messages``."""
        if not self._sent:
            return {"messages": list(messages)}
        common = self._common_prefix(messages)
        return {
            "base": common,
            "base_digest": self._chain.digest(common),
            "append": list(messages[common:]),
        }

    @staticmethod
    def _base(args: Mapping[str, Any]) -> int:
        return 0 if "messages" in args else int(args.get("base", 0))

    def prepare(self, messages: Sequence[Any], args: Mapping[str, Any]) -> None:
        """Hash the messages ``args`` (built for ``messages``) sends, ahead of :meth:`sent`.

        Optional: :meth:`sent` hashes them itself when this was not called.
        """
        base = self._base(args)
        if "messages" not in args and not self._chain.matches(base, args.get("base_digest")):
            return  # sent() will forget this record anyway
        self._pending = (args, messages, self._chain.following(base, messages[base:]))

    def sent(
        self, messages: Sequence[Any], args: Mapping[str, Any], *, owned: bool = False
    ) -> None:
        """Record that the daemon accepted ``args`` built for ``messages``.

        A delta built before a :meth:`reset` (or against a prefix since cut)
        no longer extends this record; it is forgotten and the next call sends
        the whole list. With ``owned`` the record keeps ``messages`` itself
        (the caller never changes it again) instead of a copy.
        """
        pending, self._pending = self._pending, None
        base = self._base(args)
        if "messages" not in args and not self._chain.matches(base, args.get("base_digest")):
            self.reset()
            return
        if (
            pending is not None
            and pending[0] is args
            and pending[1] is messages
            and pending[2].length == base
            and self._chain.matches(base, pending[2].after)
        ):
            tail = pending[2]
        else:
            tail = self._chain.following(base, messages[base:])
        # The new record's last encodings: sent now, or rechecked against the old ones.
        old_start = len(self._sent) - len(self._tail)
        encodings: list[bytes] = []
        for index in range(max(len(messages) - RECHECKED_TAIL, 0), len(messages)):
            if index >= base:
                encodings.append(tail.encodings[index - base])
            elif old_start <= index < len(self._sent):
                encodings.append(self._tail[index - old_start])
            else:
                encodings.append(pack(messages[index]))
        self._chain.adopt(base, tail)
        self._sent = messages if owned and isinstance(messages, list) else list(messages)
        self._tail = encodings
