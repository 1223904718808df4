"""What a task's actor keeps of the history it was sent: delta sync, estimates, view patches.

The history as last sent (with its digest chain and per-message token
counts) is kept while memory allows (:class:`HistoryCache`, least recently
used under a byte cap); a delta applies to it, a request that opts in gets
token estimates from it, and a ``patch`` view is answered against it. The
calibration (reported over estimated tokens) is kept beside it.
"""

from __future__ import annotations

import itertools
import operator
import os
from typing import Any

import anyio.to_thread
import structlog

from ctxwin import engine, proto

from ._ops import TaskContext, run_task_op, wants_budgeting
from ._tokens import TokenCounter

__all__ = ["HistoryCache", "KeptHistory"]

_log = structlog.get_logger("ctxwin.daemon.actors")

_PATCH_VIEWS = ("patch", "patch_prepend")


class KeptHistory:
    """The kept history and calibration of one task.

    Args:
        task: the task id (for errors and logs).
        cache: the daemon's accounting of kept histories.
        tokens: the token counter for estimates.
    """

    def __init__(self, *, task: str, cache: HistoryCache, tokens: TokenCounter) -> None:
        self.task = task
        self._cache = cache
        self._tokens = tokens
        self.history: engine.History | None = None
        self.calibration = engine.Calibration()
        self._estimate: tuple[int, float] | None = None  # (estimate, ratio) of the last view
        self._calibrated_by: tuple[Any, ...] | None = None
        # The overrides of the last view patch sent, and its token (see _reuse_overrides).
        self._sent_overrides: list[list[Any]] | None = None
        self._last_patch: _LastPatch | None = None  # the same for a Cline view (view_patch)
        self._patch_token: bytes | None = None
        self._patch_serial = 0
        self._patch_salt = os.urandom(8)  # tokens of an earlier actor never match
        # A native dialect's history in the engine's internal form, kept in step
        # with the history (docs/DIALECTS.md); None for the Cline dialect.
        self.dialect: engine.Dialect | None = None
        self.mapped: engine.MappedHistory | None = None
        self._kept_out: dict[int, tuple[Any, int]] = {}  # history index: (message, tokens)

    def use_dialect(self, name: str) -> None:
        """Serve the task's history in dialect ``name`` from now on."""
        dialect = engine.get_dialect(name)
        if dialect is not self.dialect:
            self.dialect = dialect
            self.mapped = None
            self._kept_out.clear()
            if self.history is not None:
                self.history.keep_pairs(dialect is None)

    async def run(self, state: engine.TaskState, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run an op over the task's history, resolving a delta and answering a patch.

        Raises:
            ProtocolError: ``resync_required`` for a delta that does not fit.
        """
        history = self._sync(args)
        mapped = None
        if self.dialect is not None:
            if history is None:
                history = self._keep(args["messages"])
            mapped = self._mapped(op, history, args.get("base", 0) if "append" in args else 0)
        context = None
        if wants_budgeting(op, args):
            if history is None:
                history = self._keep(args["messages"])
            tokens = self._tokens
            if mapped is None:
                # Count new messages off the event loop: a cold 1 MB history takes ~100 ms.
                await anyio.to_thread.run_sync(history.count_missing, tokens.count_message)
            if op == "prepare_request":
                self._calibrate(args.get("previous_request"))
            fixed = 0 if mapped is None else self._kept_out_tokens(mapped)
            context = TaskContext(history.counter(tokens.count_message), self.calibration, fixed)
        if op == "prepare_request":
            # The next report is of this request: it calibrates only against this view's estimate.
            self._estimate = None
        if mapped is not None:
            messages: Any = mapped.internal
        else:
            messages = history.messages if history is not None else args["messages"]
        target = state
        restarted = "deleted_range" not in args and self._restarted(state, history, mapped, args)
        if restarted:
            if op == "plan":
                target = state.clone()  # plan changes nothing: it says what would happen
            target.start_over()
        revision = (target.revision, target.overlay.version)
        result = run_task_op(target, op, {**args, "messages": messages}, context)
        if target is state:
            self._record_basis(state, revision, "deleted_range" in args, history, mapped, args)
        if restarted:
            result["restarted"] = True
        if op == "prepare_request" and "estimated_tokens" in result:
            self._estimate = (result["estimated_tokens"], self.calibration.ratio)
        if mapped is not None:
            assert history is not None
            return self._dialect_result(state, op, args, result, mapped, history)
        view_form = args.get("view")
        if view_form in _PATCH_VIEWS and history is not None and "messages" in result:
            patch = self.view_patch(
                result["messages"],
                history,
                state.deleted_range,
                args.get("patch_base"),
                prepend=view_form == "patch_prepend",
            )
            if patch is not None:
                del result["messages"]
                result["patch"] = patch
        return result

    def _restarted(
        self,
        state: engine.TaskState,
        history: engine.History | None,
        mapped: engine.MappedHistory | None,
        args: dict[str, Any],
    ) -> bool:
        """Whether the history is not the one the task's range and overlay were made on.

        It is not when it is shorter than the prefix they were made on, or when
        that prefix has another digest: the caller restarted or rewound the
        conversation under the same task id.
        """
        basis = state.basis
        messages: list[Any] = history.messages if history is not None else args["messages"]
        if basis is None:
            # Stored before bases were kept: only a range reaching the history's end shows it.
            deleted = state.deleted_range
            count = len(mapped.internal) if mapped is not None else len(messages)
            return deleted is not None and deleted[1] + 1 >= count
        length, digest = basis
        if len(messages) < length:
            return True
        if history is not None:
            return history.digest_of(length) != digest
        return proto.DigestChain(messages[:length]).digest(length) != digest

    def _record_basis(
        self,
        state: engine.TaskState,
        revision: tuple[int, int],
        explicit: bool,
        history: engine.History | None,
        mapped: engine.MappedHistory | None,
        args: dict[str, Any],
    ) -> None:
        """Note the history prefix the task's range and overlay now refer to, when they changed
        (or the caller set the range: it vouches for this history)."""
        extent = state.extent
        if extent == 0:
            state.basis = None
            return
        unchanged = (state.revision, state.overlay.version) == revision
        if state.basis is not None and unchanged and not explicit:
            return  # checked against this history before the op, and unchanged by it
        messages: list[Any] = history.messages if history is not None else args["messages"]
        length = mapped.history_length(extent) if mapped is not None else min(extent, len(messages))
        if history is not None:
            digest = history.digest_of(length)
        else:
            digest = proto.DigestChain(messages[:length]).digest(length)
        state.basis = (length, digest)

    def view_patch(
        self,
        view: list[Any],
        history: engine.History,
        deleted_range: list[int] | None,
        base: bytes | None,
        *,
        prepend: bool = False,
    ) -> dict[str, Any] | None:
        """``view`` as a patch on the kept history; None when it is not a view of it.

        The overrides are worked out against the last patch made (the
        positions whose message is another object than in its view, and the
        history's messages from where it changed since), so a turn that adds
        two messages costs the few it changed, not the whole view; when the
        caller's ``patch_base`` names that patch, only new or changed
        overrides are sent. With ``prepend``, a repaired message that only
        puts blocks before the history's own ones is sent as those blocks.
        """
        messages = history.messages
        length = len(messages)
        start = _view_start(view, length, deleted_range)
        unchanged = history.take_unchanged()
        if start is None:
            self._last_patch = None  # the next one starts afresh: changes since are not known
            return None
        if view is messages:
            view = list(view)  # kept as the last view: it must not change with the history
        last = self._last_patch
        token = self._next_token()
        previous, self._patch_token = self._patch_token, token
        if last is None or last.history is not history or last.start != start or length < 2:
            patch = engine.view_patch(view, messages, deleted_range if start != 2 else None)
            held = dict(patch["overrides"])
            self._last_patch = _LastPatch(history, start, view, held)
            patch["token"] = token
            return _with_prepend(patch, messages) if prepend else patch
        held, sent, dropped = _patch_step(last, view, messages, unchanged)
        self._last_patch = _LastPatch(history, start, view, held)
        patch = {"length": length, "keep_from": start, "overrides": sent, "token": token}
        if base is None or base != previous:
            patch["overrides"] = [[origin, held[origin]] for origin in sorted(held)]
        else:
            patch |= {"reuse": True, "base": previous, "dropped": dropped}
        return _with_prepend(patch, messages) if prepend else patch

    def _next_token(self) -> bytes:
        self._patch_serial += 1
        return self._patch_serial.to_bytes(8, "big") + self._patch_salt

    def _kept_out_tokens(self, mapped: engine.MappedHistory) -> int:
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
        assert self.dialect is not None
        if self.mapped is None:
            self.mapped = engine.MappedHistory(self.dialect)
        try:
            self.mapped.sync(history.messages, unchanged)
        except engine.DialectError as exc:
            raise proto.ProtocolError(
                proto.ErrorCode.BAD_REQUEST, f"{op}: {exc} ({self.dialect.name} dialect)"
            ) from None
        return self.mapped

    def _dialect_result(
        self,
        state: engine.TaskState,
        op: str,
        args: dict[str, Any],
        result: dict[str, Any],
        mapped: engine.MappedHistory,
        history: engine.History,
    ) -> dict[str, Any]:
        """An op's result with its view (of internal messages) in the dialect's form."""
        largest = result.get("largest")
        if largest:
            result["largest"] = [[mapped.history_index(i), tokens] for i, tokens in largest]
        if "messages" not in result:
            return result
        if op == "optimize_file_reads_in_memory" and not result["changed"]:
            result["messages"] = list(history.messages)  # the input, untouched
            return result
        view = result["messages"]
        missing = state.notices.missing_result
        if args.get("view") in _PATCH_VIEWS:
            # The dialects' patches keep the full override form (``prepend`` is not used).
            patch = mapped.patch(view, state.deleted_range, missing)
            if patch is not None:
                del result["messages"]
                result["patch"] = self._reuse_overrides(patch, args.get("patch_base"))
                return result
        result["messages"] = mapped.view(view, state.deleted_range, missing)
        return result

    def drop(self) -> None:
        """Forget the kept history (memory cap); the next delta gets ``resync_required``."""
        self.history = None
        self.mapped = None
        self._kept_out.clear()  # its messages are the history's: they go with it
        self._sent_overrides = None
        self._last_patch = None

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
        mapped = self.mapped
        if mapped is None:
            return None
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

    def kept_messages(self) -> int | None:
        """How many messages are kept; None when no history is."""
        return None if self.history is None else len(self.history)

    def _reuse_overrides(self, patch: dict[str, Any], base: bytes | None) -> dict[str, Any]:
        """Send only the overrides the caller does not hold from the patch it names.

        The overrides of the last patch sent are kept (the view's own message
        objects, so this costs references only); when the caller's
        ``patch_base`` is that patch's token, unchanged ones are left out.
        A dialect patch shares its first override entries with the last one
        (:meth:`engine.MappedHistory.patch` keeps them as they are made), so
        only the entries after the first that is another object are compared.
        """
        overrides: list[list[Any]] = patch["overrides"]
        sent, self._sent_overrides = self._sent_overrides, overrides
        token = self._next_token()
        previous, self._patch_token = self._patch_token, token
        patch["token"] = token
        if sent is None or base is None or base != previous:
            return patch
        # Entries are unique by index in each list: the shared ones are in neither tail.
        shared = next(
            itertools.compress(itertools.count(), map(operator.is_not, sent, overrides)),
            min(len(sent), len(overrides)),
        )
        before = dict(sent[shared:])
        after = overrides[shared:]
        patch["overrides"] = [item for item in after if before.get(item[0]) is not item[1]]
        if "origins" in patch:  # the caller holds those of the overrides it holds
            sending = {item[0] for item in patch["overrides"]}
            marked = [item for item in patch.pop("origins") if item[0] in sending]
            if marked:
                patch["origins"] = marked
        patch["reuse"] = True
        patch["base"] = previous
        now = {item[0] for item in after}
        patch["dropped"] = [origin for origin in before if origin not in now]
        return patch

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
        # A native dialect's views are built from its internal form, which keeps its pairs.
        self.history = engine.History(messages, pairs=self.dialect is None)
        return self.history

    def settle(self) -> None:
        """Hash what the last request added and account for its size (under the cache's cap).

        Called once the reply is out: the digests are for the next request, so
        hashing them (60 us for 40 KB) need not delay this one's reply.
        """
        if self.history is not None:
            self.history.settle()
            self._cache.update(self)

    def _calibrate(self, usage: dict[str, Any] | None) -> None:
        """Fold a reported usage into the ratio, against the estimate of that request's view."""
        if usage is None or self._estimate is None:
            return
        key = tuple(usage.get(field) for field in ("ts", *proto.USAGE_FIELDS))
        if key == self._calibrated_by:
            return  # the same report again (a retried call): counted once
        self._calibrated_by = key
        estimate, ratio = self._estimate
        real = sum(usage.get(field) or 0 for field in ("tokens_in", "cache_writes", "cache_reads"))
        self.calibration.update(real, round(estimate / ratio))


def _view_start(view: list[Any], length: int, deleted_range: list[int] | None) -> int | None:
    """The ``keep_from`` of a view of a history of ``length``, or None when it is not one.

    Views are the first pair plus everything after the range; an op that
    answers with the history unchanged (nothing optimised) gives a view
    without a range.
    """
    for candidate in (deleted_range, None):
        start = engine.keep_from(candidate)
        expected = length if length < 2 else 2 + max(length - start, 0)
        if len(view) == expected:
            return start
    return None


def _view_patch(
    view: list[Any], history: list[Any], deleted_range: list[int] | None
) -> dict[str, Any] | None:
    """The view as a whole patch on the history (every override), or None when not a view of it."""
    start = _view_start(view, len(history), deleted_range)
    if start is None:
        return None
    return engine.view_patch(view, history, deleted_range if start != 2 else None)


class _LastPatch:
    """The last Cline view patch made: its history, ``keep_from``, view and overrides."""

    __slots__ = ("held", "history", "start", "view")

    def __init__(
        self, history: engine.History, start: int, view: list[Any], held: dict[int, Any]
    ) -> None:
        self.history = history
        self.start = start
        self.view = view
        self.held = held


_ABSENT = object()


def _patch_step(
    last: _LastPatch, view: list[Any], messages: list[Any], unchanged: int
) -> tuple[dict[int, Any], list[list[Any]], list[int]]:
    """The overrides of ``view`` worked out from the last patch's: (all, new or changed, dropped).

    A view position needs a look only when its message is another object than
    in the last view, when it is past that view's end, or when the history
    message it stands for changed since (index ``>= unchanged``): everywhere
    else the message and the history's are the objects they were, so it is an
    override exactly when it was one, with the same message.
    """
    shift = last.start - 2  # history index of view position p >= 2 is p + shift
    old_view, old_held = last.view, last.held
    tail = unchanged if unchanged < 2 else max(unchanged - shift, 2)
    tail = min(tail, len(view), len(old_view))
    # The positions before the tail whose message is another object (a C-speed scan).
    moved = itertools.compress(range(tail), map(operator.is_not, view, old_view))
    held = dict(old_held)
    sent: list[list[Any]] = []
    dropped: list[int] = []
    for place in itertools.chain(moved, range(tail, len(view))):
        origin = place if place < 2 else place + shift
        message = view[place]
        if message is messages[origin]:
            if held.pop(origin, _ABSENT) is not _ABSENT:
                dropped.append(origin)
        else:
            held[origin] = message
            if old_held.get(origin) is not message:
                sent.append([origin, message])
    for origin in range(len(messages), len(old_view) + shift):
        # History messages past the new end (it was cut back): their overrides go.
        if held.pop(origin, _ABSENT) is not _ABSENT:
            dropped.append(origin)
    return held, sent, dropped


def _with_prepend(patch: dict[str, Any], messages: list[Any]) -> dict[str, Any]:
    """``patch`` with each override that only puts blocks first sent as a ``prepend`` entry."""
    overrides: list[list[Any]] = []
    prepend: list[list[Any]] = []
    for origin, message in patch["overrides"]:
        blocks = proto.prepended_blocks(messages[origin], message)
        if blocks is None:
            overrides.append([origin, message])
        else:
            prepend.append([origin, blocks])
    patch["overrides"] = overrides
    patch["prepend"] = prepend
    return patch


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
    per_message = RESIDENT_PER_MESSAGE if kept.dialect is None else RESIDENT_PER_NATIVE_MESSAGE
    return RESIDENT_PER_BYTE * history.size + per_message * len(history.messages)


class HistoryCache:
    """Least recently used accounting of the histories actors keep, under a byte cap.

    Each history is charged its estimated resident size (:func:`resident_size`),
    not its encoded size, which is a fifth to a sixtieth of what it holds.

    Args:
        cap: total resident bytes of kept histories before the least recently used go.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.total = 0
        self._sizes: dict[KeptHistory, int] = {}  # insertion order = least recently used first

    def update(self, kept: KeptHistory) -> None:
        """Note that ``kept`` used (or dropped) its history; evict others over the cap."""
        self.total -= self._sizes.pop(kept, 0)
        if kept.history is None:
            return
        size = resident_size(kept)
        self._sizes[kept] = size
        self.total += size
        while self.total > self.cap and len(self._sizes) > 1:
            oldest = next(iter(self._sizes))
            if oldest is kept:
                break
            self.total -= self._sizes.pop(oldest)
            oldest.drop()
            _log.info("history_evicted", task=oldest.task, reason="memory cap")

    def forget(self, kept: KeptHistory) -> None:
        """The actor stopped: its history is gone with it."""
        self.total -= self._sizes.pop(kept, 0)

    def __len__(self) -> int:
        return len(self._sizes)
