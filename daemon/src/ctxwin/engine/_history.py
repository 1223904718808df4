"""A task's conversation as its caller last sent it, for delta sync (per-turn cost).

The caller keeps its history and sends only what a turn adds (``base``,
``base_digest``, ``append``); this class keeps the daemon's copy, its prefix
digests and per-message caches in step with it. Views built from
:attr:`History.messages` share the history's message objects wherever they
are unchanged, which is what a view patch relies on (:mod:`._patch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ctxwin.proto import DigestChain

from ._blocks import Message
from ._dialect import CLINE_DIALECT, Dialect
from ._view import ViewCache, find_repairs


class ResyncRequired(Exception):
    """The caller's prefix is not the one held here: it must send the whole list once."""


class History:
    """The messages of one task with their prefix digests and cached token counts."""

    __slots__ = ("_chain", "_others", "_positions", "_tokens", "_unchanged", "cache", "messages")

    def __init__(
        self, messages: Sequence[Message] = (), *, dialect: Dialect = CLINE_DIALECT
    ) -> None:
        """Keep ``messages``, a history of ``dialect``.

        Views are built from :attr:`messages` in the Cline dialect, which
        :attr:`cache` is kept for (pass it to the view); a native dialect's
        views are built from its internal form (:class:`MappedHistory`, which
        keeps its own), and :attr:`cache` is None.
        """
        self.messages: list[Message] = list(messages)
        self.cache: ViewCache | None = None
        self.use_dialect(dialect)
        # Digests of the first len(self._chain) messages; the rest are hashed by
        # settle(), which the daemon calls once the reply is out: a request needs
        # the digests of what came before it, the next request those of its messages.
        self._chain = DigestChain()
        self._tokens: list[int | None] = [None] * len(self.messages)
        # id(message) -> index for the history's own objects, kept in step with cuts.
        self._positions = {id(message): index for index, message in enumerate(self.messages)}
        # Counts of view messages that are not the history's (overlaid or repaired
        # copies); a view built on the last one shares them, so they count once.
        self._others: dict[int, tuple[Message, int]] = {}
        # Messages below this index are the same objects as at the last take_unchanged().
        self._unchanged = 0

    def _cut(self, length: int) -> None:
        """Drop messages from ``length`` on, with their caches."""
        positions = self._positions
        for message in self.messages[length:]:
            positions.pop(id(message), None)
        del self.messages[length:]
        del self._tokens[length:]
        if self.cache is not None:
            self.cache.changed_from(length)
        self._unchanged = min(self._unchanged, length)

    def _extend(self, messages: Sequence[Message]) -> None:
        first = len(self.messages)
        self.messages.extend(messages)
        self._tokens.extend([None] * len(messages))
        positions = self._positions
        for offset, message in enumerate(messages):
            positions[id(message)] = first + offset

    def __len__(self) -> int:
        return len(self.messages)

    def take_unchanged(self) -> int:
        """How many leading messages are the same objects as at the last call (0 the first time).

        A view patch made on the last one needs to look again only at view
        messages that changed and at history messages from there on.
        """
        unchanged, self._unchanged = self._unchanged, len(self.messages)
        return min(unchanged, len(self.messages))

    def settle(self) -> None:
        """Hash the messages the digest chain does not cover yet (cheap when it covers all)."""
        chain = self._chain
        if len(chain) < len(self.messages):
            chain.extend(self.messages[len(chain) :])

    @property
    def digest(self) -> bytes:
        """The digest of the whole history."""
        self.settle()
        return self._chain.digest(len(self.messages))

    def digest_of(self, length: int) -> bytes:
        """The digest of the first ``length`` messages."""
        if length > len(self._chain):
            self.settle()
        return self._chain.digest(length)

    def replace(self, messages: Sequence[Message]) -> None:
        """Take a whole list; caches of the prefix it shares with the old one are kept."""
        self.settle()
        old = self._chain
        fresh = DigestChain(messages)
        common = 0
        limit = min(len(old), len(fresh))
        while common < limit and old.digest(common + 1) == fresh.digest(common + 1):
            common += 1
        self._cut(common)
        self._extend(messages[common:])
        self._chain = fresh
        self._recheck_pairs(common)

    def apply(self, base: int, base_digest: object, append: Sequence[Message]) -> None:
        """Cut back to ``base`` messages and append ``append``.

        Raises:
            ResyncRequired: the prefix of ``base`` messages here has another
                digest, or is shorter than ``base``.
        """
        if base > len(self._chain):
            self.settle()
        if not self._chain.matches(base, base_digest):
            held = len(self.messages)
            raise ResyncRequired(
                f"the daemon holds {held} messages of this task and its prefix of {base} "
                "does not have the given digest; send the whole list"
            )
        self._cut(base)
        self._chain.truncate(base)
        self._extend(append)  # hashed by settle()
        self._recheck_pairs(base)

    def use_dialect(self, dialect: Dialect) -> None:
        """Keep the view cache from now on for a dialect whose views are built from
        :attr:`messages`, or drop it (see ``__init__``)."""
        if dialect.native:
            self.cache = None
        elif self.cache is None or self.cache.strict != dialect.strict:
            self.cache = ViewCache(self.messages, dialect.strict)

    def _recheck_pairs(self, first_new: int) -> None:
        """Update the pairs needing repair once messages from ``first_new`` on changed."""
        cache = self.cache
        if cache is None:
            return
        first_pair = max(first_new - 1, 0)
        repairs = cache.repairs
        while repairs and repairs[-1] >= first_pair:
            repairs.pop()
        repairs.extend(find_repairs(self.messages, first_pair, cache.strict))

    @property
    def size(self) -> int:
        """Bytes of the history's canonical encoding."""
        self.settle()
        return self._chain.size()

    def count_missing(self, count: Callable[[Message], int]) -> int:
        """Count every message not counted yet; returns how many were (safe in a worker thread
        while nothing else changes this history)."""
        counted = 0
        for index, cached in enumerate(self._tokens):
            if cached is None:
                self._tokens[index] = count(self.messages[index])
                counted += 1
        return counted

    def tokens(self, index: int, count: Callable[[Message], int]) -> int:
        """Tokens of message ``index``, counted once while the message is unchanged."""
        cached = self._tokens[index]
        if cached is None:
            cached = self._tokens[index] = count(self.messages[index])
        return cached

    def counter(self, count: Callable[[Message], int]) -> Callable[[Message], int]:
        """A message counter that reuses this history's caches.

        The history's own messages are counted once while unchanged; other
        messages (the overlaid or repaired copies in a view) once per object.
        """
        positions = self._positions
        others = self._others
        if len(others) > 2 * len(self.messages) + 64:
            others.clear()  # copies from views long gone

        def cached(message: Message) -> int:
            key = id(message)
            index = positions.get(key)
            if index is not None:
                return self.tokens(index, count)
            held = others.get(key)
            if held is not None and held[0] is message:
                return held[1]
            tokens = count(message)
            others[key] = (message, tokens)
            return tokens

        return cached
