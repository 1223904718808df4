"""What a task keeps of the history it was sent: delta sync, its internal form, view patches.

The history as last sent (with its digest chain and per-message token
counts) is kept while memory allows (:class:`HistoryCache`, least recently
used under a byte cap); a delta applies to it, a request that opts in gets
token estimates from it, and a ``patch`` view is answered against it. A
native dialect's history is kept in the internal form beside it, and a
view is mapped back from that form here (:meth:`KeptHistory.view_back`).

An eviction drops the history and everything made from it. What the task
itself keeps is not here, so none of it goes with the history: its
calibration is its session's (``_calibration.py``), the basis of its range
and edits its :class:`ctxwin.engine.TaskState`'s (``_basis.py``).
"""

from __future__ import annotations

from typing import Any

import structlog

from ctxwin import engine, proto

from ._ops import dialect_refused
from ._tokens import TokenCounter

__all__ = [
    "HistoryCache",
    "KeptHistory",
    "overlay_sources",
]

_log = structlog.get_logger("ctxwin.daemon.actors")

_PATCH_VIEWS = ("patch", "patch_prepend")


class KeptHistory:
    """The kept history of one task: the cache's entry for it.

    Args:
        task: the task id (for errors and logs).
        cache: the daemon's accounting of kept histories.
        tokens: the token counter for estimates.
    """

    def __init__(self, *, task: str, cache: HistoryCache, tokens: TokenCounter) -> None:
        self.task = task
        self.owner = "?"  # the client whose task it is (the actor sets it)
        self._cache = cache
        self._tokens = tokens
        self.history: engine.History | None = None
        self.patches = engine.PatchMaker()  # views sent as patches, and what they carried
        # The task's dialect; a native one's history in the engine's internal form is
        # kept in step with the history (docs/DIALECTS.md), None for the Cline dialect.
        self.dialect: engine.Dialect = engine.get_dialect(proto.CLINE)
        self.mapped: engine.MappedHistory | None = None
        self._kept_out: dict[int, tuple[Any, int]] = {}  # history index: (message, tokens)

    def use_dialect(self, dialect: engine.Dialect) -> None:
        """Serve the task's history in ``dialect`` from now on."""
        if dialect is not self.dialect:
            self.dialect = dialect
            self.mapped = None
            self._kept_out.clear()
            if self.history is not None:
                self.history.use_dialect(dialect)

    def resolve(self, args: dict[str, Any], keep: bool) -> engine.History | None:
        """The history a request runs on: the kept one brought in step with it, or the
        list it sent, kept when ``keep`` or when the dialect is a native one (whose
        internal form is kept beside it); None when it is not kept.

        Raises:
            ProtocolError: ``resync_required`` for a delta that does not fit.
        """
        history = self._sync(args)
        if history is None and (keep or self.dialect.native):
            history = self._keep(args["messages"])
        return history

    def internal(
        self, op: str, history: engine.History | None, args: dict[str, Any]
    ) -> engine.MappedHistory | None:
        """A native dialect's history in the internal form, synced with it (only new
        messages mapped); None for the Cline dialect, which the engine runs on as it is.

        Raises:
            ProtocolError: ``bad_request`` naming the history index of a
                message the dialect cannot carry.
        """
        if not self.dialect.native or history is None:
            return None
        return self._mapped(op, history, args.get("base", 0) if "append" in args else 0)

    def kept_out_tokens(self, mapped: engine.MappedHistory) -> int:
        """Tokens of the kept-out (system) messages, sent with every view; counted as
        ``count_tokens`` counts them, once per message object."""
        counted = self._kept_out
        total = 0
        for index in mapped.systems:
            message = mapped.source[index]
            held = counted.get(index)
            if held is None or held[0] is not message:
                text = engine.kept_out_text(message)
                held = counted[index] = (message, self._tokens.count_text(text))
            total += held[1]
        if len(counted) > len(mapped.systems):
            systems = set(mapped.systems)
            for index in [index for index in counted if index not in systems]:
                del counted[index]
        return total

    def _mapped(self, op: str, history: engine.History, unchanged: int) -> engine.MappedHistory:
        """The kept history in the internal form, synced with it (only new messages mapped).

        Raises:
            ProtocolError: ``bad_request`` naming the history index of a
                message the dialect cannot carry.
        """
        if self.mapped is None:
            self.mapped = engine.MappedHistory(self.dialect)
        try:
            self.mapped.sync(history.messages, unchanged)
        except engine.DialectError as exc:
            raise dialect_refused(op, self.dialect, exc) from None
        return self.mapped

    def view_back(
        self,
        state: engine.TaskState,
        op: str,
        args: dict[str, Any],
        result: dict[str, Any],
        history: engine.History | None,
        mapped: engine.MappedHistory | None,
    ) -> dict[str, Any]:
        """An op's result with its view as the caller's messages: mapped back from the
        internal form (a native dialect), and sent as a patch on the history when asked."""
        form = args.get("view")
        if mapped is None:
            if form in _PATCH_VIEWS and history is not None and "messages" in result:
                patch = self.patches.of_history(
                    result["messages"],
                    history,
                    state.deleted_range,
                    args.get("patch_base"),
                    prepend=form == "patch_prepend",
                    gaps=state.dropped if args.get("patch_skip") else None,
                )
                if patch is not None:
                    del result["messages"]
                    result["patch"] = patch
            return result
        assert history is not None
        _map_history_indices(op, result, mapped)
        if "messages" not in result:
            return result
        if op == "optimize_file_reads_in_memory" and not result["changed"]:
            result["messages"] = list(history.messages)  # the input, untouched
            return result
        view = result["messages"]
        missing = state.notices.missing_result
        if form in _PATCH_VIEWS:
            # The dialects' patches keep the full override form (``prepend`` is not used).
            patch = self.patches.of_mapped(
                mapped, view, state.deleted_range, args.get("patch_base"), missing, state.dropped
            )
            if patch is not None:
                del result["messages"]
                result["patch"] = patch
                return result
        result["messages"] = mapped.view(view, state.deleted_range, missing, state.dropped)
        return result

    def drop(self) -> None:
        """Forget the kept history (memory cap); the next delta gets ``resync_required``."""
        self.history = None
        self.mapped = None
        self._kept_out.clear()  # its messages are the history's: they go with it
        self.patches.forget()

    def sources(self, overlay: engine.Overlay) -> list[list[Any]] | None:
        """Where the blocks a native dialect's overlay edits came from, for ``inspect``.

        For each (internal message, block) of ``overlay`` that is a block of
        the mapped history with a text: ``[message, block, history index,
        text]``, the text being the block's own, before any edit (what a
        duplicate-read notice replaced). Sorted by message and block.

        Returns:
            The sources; None when no mapped history is held (the Cline
            dialect, or no history sent since the task was loaded or its
            history was dropped).
        """
        return None if self.mapped is None else overlay_sources(self.mapped, overlay)

    def kept_messages(self) -> int | None:
        """How many messages are kept; None when no history is."""
        return None if self.history is None else len(self.history)

    def _sync(self, args: dict[str, Any]) -> engine.History | None:
        """Bring the kept history in step with the request; None when none is kept.

        Raises:
            ProtocolError: ``resync_required`` when a delta does not fit the
                history kept here (or none is kept: new, restarted or evicted).
        """
        if "append" in args:
            if self.history is None:
                raise proto.ProtocolError(
                    proto.ErrorCode.RESYNC_REQUIRED,
                    f"the daemon holds no history of task {self.task} (new task, restart or "
                    "eviction); send the whole list",
                )
            try:
                self.history.apply(args["base"], args["base_digest"], args["append"])
            except engine.ResyncRequired as exc:
                # Kept: the whole list that follows shares most of it (and its caches).
                raise proto.ProtocolError(proto.ErrorCode.RESYNC_REQUIRED, str(exc)) from None
        elif self.history is not None:
            self.history.replace(args["messages"])
        elif args.get("view") in _PATCH_VIEWS:
            return self._keep(args["messages"])
        else:
            return None
        return self.history

    def _keep(self, messages: list[Any]) -> engine.History:
        self.history = engine.History(messages, dialect=self.dialect)
        return self.history

    def settle(self) -> None:
        """Hash what the last request added and account for its size (under the cache's cap).

        Called once the reply is out: the digests are for the next request, so
        hashing them (60 us for 40 KB) need not delay this one's reply.
        """
        if self.history is not None:
            self.history.settle()
            self._cache.update(self)


def _map_history_indices(op: str, result: dict[str, Any], mapped: engine.MappedHistory) -> None:
    """Map the result fields ``op`` declares to name history indices
    (``proto.OPS[op].history_indices``, each a list of ``[index, ...]``) from the
    internal form's indices to the caller's history indices, in place."""
    for name in proto.OPS[op].history_indices:
        entries = result.get(name)
        if entries:
            result[name] = [[mapped.history_index(entry[0]), *entry[1:]] for entry in entries]


def overlay_sources(mapped: engine.MappedHistory, overlay: engine.Overlay) -> list[list[Any]]:
    """Where the blocks ``overlay`` edits came from in ``mapped`` (:meth:`KeptHistory.sources`)."""
    internal = mapped.internal
    found: list[list[Any]] = []
    for index in overlay.indices():
        updates = overlay.messages[index]
        content = internal[index].get("content") if index < len(internal) else None
        if not isinstance(content, list):
            continue
        for block in sorted(updates.blocks):
            item = content[block] if block < len(content) else None
            if not isinstance(item, dict):
                continue
            text = engine.text_of(item)
            source = item.get(engine.SRC)
            # A notice put in as a block of its own (message 1 without a text) has none.
            if text is not None and isinstance(source, int):
                found.append([index, block, source, text])
    return found


RESIDENT_PER_BYTE = 5
"""Resident bytes a kept history takes per byte of its encoding (bench/memory.py)."""

RESIDENT_PER_MESSAGE = 800
"""Resident bytes per kept message of the Cline dialect beyond its encoding (bench/memory.py)."""

RESIDENT_PER_NATIVE_MESSAGE = 1800
"""The same for a native dialect, whose internal form is kept beside the history."""


def resident_size(kept: KeptHistory) -> int:
    """What keeping ``kept``'s history costs in resident memory, as measured.

    bench/memory.py (bench/RESULTS.md, "memory"): the daemon's RSS grew by 4.9
    times the encoded size for a real conversation and by 27.9 times for
    200,000 two-character messages (61.5 times in a native dialect), the cost of
    Python objects per message and block. Charging a share per byte and one per
    message charges every measured shape 0.98 to 1.35 times its real cost.
    """
    history = kept.history
    if history is None:
        return 0
    per_message = RESIDENT_PER_NATIVE_MESSAGE if kept.dialect.native else RESIDENT_PER_MESSAGE
    return RESIDENT_PER_BYTE * history.size + per_message * len(history.messages)


class HistoryCache:
    """Least recently used accounting of the histories actors keep, under a byte cap.

    Each history is charged its estimated resident size (:func:`resident_size`),
    not its encoded size, which is a fifth to a sixtieth of what it holds.
    Over the cap, histories go from the client (the tasks' owner) that holds
    the most bytes, its least recently used first: a client that floods the
    cache drops its own histories, not the others'.

    Args:
        cap: total resident bytes of kept histories before the least recently used go.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        # owner -> its histories and their sizes, least recently used first
        self._owners: dict[str, dict[KeptHistory, int]] = {}
        self.by_owner: dict[str, int] = {}  # owner -> bytes held

    def update(self, kept: KeptHistory) -> None:
        """Note that ``kept`` used (or dropped) its history; evict others over the cap."""
        self._remove(kept)
        if kept.history is None:
            return
        size = resident_size(kept)
        self._owners.setdefault(kept.owner, {})[kept] = size
        self.by_owner[kept.owner] = self.by_owner.get(kept.owner, 0) + size
        self.total += size
        while self.total > self.cap:
            oldest = self._victim(kept)
            if oldest is None:
                break
            self._remove(oldest)
            oldest.drop()
            _log.info("history_evicted", task=oldest.task, owner=oldest.owner, reason="memory cap")

    def _victim(self, kept: KeptHistory) -> KeptHistory | None:
        """The least recently used history of the owner holding the most, never ``kept``."""
        for owner in sorted(self.by_owner, key=self.by_owner.__getitem__, reverse=True):
            for candidate in self._owners[owner]:
                if candidate is not kept:
                    return candidate
        return None

    def _remove(self, kept: KeptHistory) -> None:
        histories = self._owners.get(kept.owner)
        if histories is None:
            return
        size = histories.pop(kept, None)
        if size is None:
            return
        self.total -= size
        left = self.by_owner[kept.owner] - size
        if histories:
            self.by_owner[kept.owner] = left
        else:
            del self._owners[kept.owner]
            del self.by_owner[kept.owner]

    def forget(self, kept: KeptHistory) -> None:
        """The actor stopped: its history is gone with it."""
        self._remove(kept)

    def __len__(self) -> int:
        return sum(len(histories) for histories in self._owners.values())
