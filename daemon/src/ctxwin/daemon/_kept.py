"""What a task's actor keeps of the history it was sent: delta sync, estimates, view patches.

The history as last sent (with its digest chain and per-message token
counts) is kept while memory allows (:class:`HistoryCache`, least recently
used under a byte cap); a delta applies to it, a request that opts in gets
token estimates from it, and a ``patch`` view is answered against it. The
calibration (reported over estimated tokens) is kept beside it.
"""

from __future__ import annotations

import os
from typing import Any

import anyio.to_thread
import structlog

from ctxwin import engine, proto

from ._ops import TaskContext, run_task_op, wants_budgeting
from ._tokens import TokenCounter

__all__ = ["HistoryCache", "KeptHistory"]

_log = structlog.get_logger("ctxwin.daemon.actors")


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
        self._sent_overrides: dict[int, Any] | None = None
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
        result = run_task_op(state, op, {**args, "messages": messages}, context)
        if op == "prepare_request" and context is not None:
            self._estimate = (result["estimated_tokens"], self.calibration.ratio)
        if mapped is not None:
            assert history is not None
            return self._dialect_result(state, op, args, result, mapped, history)
        if args.get("view") == "patch" and history is not None and "messages" in result:
            patch = _view_patch(result["messages"], history.messages, state.deleted_range)
            if patch is not None:
                del result["messages"]
                result["patch"] = self._reuse_overrides(patch, args.get("patch_base"))
        return result

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
        if args.get("view") == "patch":
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

    def kept_messages(self) -> int | None:
        """How many messages are kept; None when no history is."""
        return None if self.history is None else len(self.history)

    def _reuse_overrides(self, patch: dict[str, Any], base: bytes | None) -> dict[str, Any]:
        """Send only the overrides the caller does not hold from the patch it names.

        The overrides of the last patch sent are kept (the view's own message
        objects, so this costs references only); when the caller's
        ``patch_base`` is that patch's token, unchanged ones are left out.
        """
        overrides = dict(patch["overrides"])
        sent, self._sent_overrides = self._sent_overrides, overrides
        self._patch_serial += 1
        token = self._patch_serial.to_bytes(8, "big") + self._patch_salt
        previous, self._patch_token = self._patch_token, token
        patch["token"] = token
        if sent is None or base is None or base != previous:
            return patch
        patch["overrides"] = [
            [origin, message]
            for origin, message in patch["overrides"]
            if sent.get(origin) is not message
        ]
        patch["reuse"] = True
        patch["base"] = previous
        patch["dropped"] = [origin for origin in sent if origin not in overrides]
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
        elif args.get("view") == "patch":
            return self._keep(args["messages"])
        else:
            return None
        return self.history

    def _keep(self, messages: list[Any]) -> engine.History:
        self.history = engine.History(messages)
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


def _view_patch(
    view: list[Any], history: list[Any], deleted_range: list[int] | None
) -> dict[str, Any] | None:
    """The view as a patch on the history, or None when it is not a view of it.

    Views are the first pair plus everything after the range; an op that
    answers with the history unchanged (nothing optimised) gives a view
    without a range.
    """
    for candidate in (deleted_range, None):
        start = engine.keep_from(candidate)
        expected = len(history) if len(history) < 2 else 2 + max(len(history) - start, 0)
        if len(view) == expected:
            return engine.view_patch(view, history, candidate)
    return None


class HistoryCache:
    """Least recently used accounting of the histories actors keep, under a byte cap.

    Sizes are the histories' canonical encodings (their digest chains know
    them); the objects in memory take a few times more.

    Args:
        cap: total bytes of kept histories before the least recently used go.
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
        size = kept.history.size
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
