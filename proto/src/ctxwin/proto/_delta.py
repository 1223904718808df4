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
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence
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
        last = self._prefix[-1]
        size = self._sizes[-1]
        for message in messages:
            encoded = pack(message)
            message_hash = hashlib.blake2b(encoded, digest_size=DIGEST_SIZE).digest()
            last = hashlib.blake2b(last + message_hash, digest_size=DIGEST_SIZE).digest()
            size += len(encoded)
            self._prefix.append(last)
            self._sizes.append(size)

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` messages."""
        del self._prefix[length + 1 :]
        del self._sizes[length + 1 :]


def apply_view_patch(history: Sequence[Any], patch: Mapping[str, Any]) -> list[Any]:
    """Rebuild a view from the caller's own history and a patch result.

    A patch is ``{"length": n, "keep_from": k, "overrides": [[index, message], ...]}``:
    the view is messages 0 and 1 and ``k`` to ``n - 1`` of the history (all of
    it when ``n < 2``), with each listed index replaced by its message.

    Raises:
        ValueError: when the patch does not fit ``history``.
    """
    length = patch.get("length")
    keep_from = patch.get("keep_from")
    overrides = patch.get("overrides")
    if (
        not isinstance(length, int)
        or not isinstance(keep_from, int)
        or not isinstance(overrides, list)
        or length != len(history)
    ):
        raise ValueError("view patch does not match the history it is applied to")
    if "order" in patch:
        return _apply_ordered(history, patch["order"], overrides)
    if length < 2:
        view, start, shift = list(history), 0, 0
    else:
        start = max(keep_from, 2)
        view = [history[0], history[1], *history[start:]]
        shift = start - 2  # view position of origin i >= start is i - shift
    for item in overrides:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int):
            raise ValueError("view patch overrides an index that is not in the view")
        origin = item[0]
        if 0 <= origin < 2:
            view[origin] = item[1]
        elif start <= origin < length:
            view[origin - shift] = item[1]
        else:
            raise ValueError("view patch overrides an index that is not in the view")
    return view


def _apply_ordered(history: Sequence[Any], order: object, overrides: list[Any]) -> list[Any]:
    """A dialect view: the history indices of ``order`` (``[start, end)`` runs, in view order),
    each replaced by its override: one message, or a list of messages (docs/DIALECTS.md)."""
    if not isinstance(order, list):
        raise ValueError("view patch order must be a list of [start, end] runs")
    replaced: dict[int, Any] = {}
    for item in overrides:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int):
            raise ValueError("view patch overrides an index that is not in the view")
        replaced[item[0]] = item[1]
    view: list[Any] = []
    used = 0
    for run in order:
        if (
            not isinstance(run, list)
            or len(run) != 2
            or not all(isinstance(bound, int) for bound in run)
            or not 0 <= run[0] <= run[1] <= len(history)
        ):
            raise ValueError("view patch order holds a run outside the history")
        for index in range(run[0], run[1]):
            if index in replaced:
                used += 1
                value = replaced[index]
                if isinstance(value, list):
                    view.extend(value)
                else:
                    view.append(value)
            else:
                view.append(history[index])
    if used != len(replaced):
        raise ValueError("view patch overrides an index that is not in the view")
    return view


class PatchReceiver:
    """A client's side of patches that reuse the overrides of an earlier one.

    Every patch carries a ``token``. A caller that sends a token it applied as
    ``patch_base`` may get ``reuse: true`` with ``base`` (that token): the
    overrides of that patch stand, except the ``dropped`` indices, and
    ``overrides`` lists only what is new or changed. Overlaid messages then
    cross the wire once, not every turn. Any mismatch (a lost reply, a daemon
    restart) makes the daemon send every override again. The overrides of the
    last few patches are kept, so that replies to calls made concurrently on
    one task apply whatever order they are read in.
    """

    __slots__ = ("_held", "token")

    KEPT = 4

    def __init__(self) -> None:
        self.token: bytes | None = None
        self._held: dict[bytes, dict[int, Any]] = {}

    def apply(self, history: Sequence[Any], patch: Mapping[str, Any]) -> list[Any]:
        """The view ``patch`` describes; remembers its overrides for later ones.

        Raises:
            ValueError: the patch does not fit ``history`` or reuses a patch not held.
        """
        overrides = patch.get("overrides")
        if not isinstance(overrides, list):
            raise ValueError("view patch without overrides")
        held: dict[int, Any] = {}
        if patch.get("reuse"):
            base = patch.get("base")
            dropped = patch.get("dropped")
            previous = self._held.get(base) if isinstance(base, bytes) else None
            if previous is None or not isinstance(dropped, list):
                raise ValueError("view patch reuses overrides this client does not hold")
            held = dict(previous)
            for origin in dropped:
                held.pop(origin, None)
        for item in overrides:
            if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], int):
                raise ValueError("view patch overrides an index that is not in the view")
            held[item[0]] = item[1]
        view = apply_view_patch(history, {**patch, "overrides": [[o, m] for o, m in held.items()]})
        token = patch.get("token")
        if isinstance(token, bytes):
            self._held[token] = held
            while len(self._held) > self.KEPT:
                del self._held[next(iter(self._held))]
            self.token = token
        return view

    def reset(self) -> None:
        """Forget the held overrides: the next patch carries them all."""
        self.token = None
        self._held = {}


RECHECKED_TAIL = 2
"""Messages at the end of the last sync that are hashed again even when identical objects."""


class DeltaSender:
    """A client's record of what it last sent the daemon for one task.

    It turns each call's full history into the smallest request the daemon can
    check: ``{"base", "base_digest", "append"}`` when a prefix was sent
    before, else ``{"messages"}``. Messages already sent are taken as
    unchanged when they are the very same objects, except the last
    :data:`RECHECKED_TAIL` of the previous sync, which are hashed again
    (agents edit the newest message in place); a caller that edits older
    messages in place calls :meth:`reset`.
    """

    __slots__ = ("_chain", "_sent")

    def __init__(self) -> None:
        self._chain = DigestChain()
        self._sent: list[Any] = []

    def reset(self) -> None:
        """Forget what was sent: the next call sends the whole list."""
        self._chain = DigestChain()
        self._sent = []

    def _common_prefix(self, messages: Sequence[Any]) -> int:
        limit = min(len(self._sent), len(messages))
        trusted = max(min(limit, len(self._sent) - RECHECKED_TAIL), 0)
        # The first message that is not the very object sent. Identity, not
        # equality: an equal message may encode differently (1 and 1.0, key
        # order), and the daemon must hold what the caller holds.
        differs = map(operator.is_not, itertools.islice(messages, trusted), self._sent)
        common = next(itertools.compress(itertools.count(), differs), trusted)
        while common < limit:
            if chain_digest(self._chain.digest(common), message_digest(messages[common])) != (
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

    def sent(self, messages: Sequence[Any], args: Mapping[str, Any]) -> None:
        """Record that the daemon accepted ``args`` built for ``messages``.

        A delta built before a :meth:`reset` (or against a prefix since cut)
        no longer extends this record; it is forgotten and the next call sends
        the whole list.
        """
        if "messages" in args:
            base = 0
        else:
            base = args.get("base", 0)
            if not self._chain.matches(base, args.get("base_digest")):
                self.reset()
                return
        self._chain.truncate(base)
        self._chain.extend(messages[base:])
        self._sent = list(messages)
