"""Delta sync: send what a turn adds, get views back as patches (DESIGN.md, delta sync)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from ctxwin import proto
from ctxwin.proto import ErrorCode

from ._core import Call, Messages, copy_messages, validate
from ._errors import CtxwinError

T = TypeVar("T")


# The parts of ping's ``features`` delta sync uses (``proto.FEATURES`` says what they are).
DELTA = "delta"
VIEW_PATCH = "view_patch"
VIEW_PATCH_PREPEND = "view_patch_prepend"
VIEW_PATCH_SKIP = "view_patch_skip"


class DeltaSync:
    """A task handle's delta sync with the daemon (DESIGN.md, delta sync).

    After the first full list, history ops send ``base``/``base_digest``/``append``
    and ask for views as patches, which are applied to the caller's own list.
    When the daemon answers ``resync_required`` the whole list goes once
    more. What is asked for follows what the daemon says it supports (ping's
    ``features``): a daemon without delta sync turns it off for good, one
    without the ``prepend`` form gets asked for plain patches, one without
    patches for whole views. A daemon with the ``skip`` form is told the handle
    applies it (``patch_skip``), so views with gaps come as patches too.
    """

    __slots__ = ("enabled", "patches", "sender", "skip", "view")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.sender = proto.DeltaSender()
        self.patches = proto.PatchReceiver()
        # The view form asked for: patches with ``prepend`` entries, plain ones, or
        # None (whole views), as the daemon's features allow.
        self.view: str | None = "patch_prepend"
        self.skip = True  # ``patch_skip`` is asked for (the daemon names ``view_patch_skip``)

    def reset(self) -> None:
        """Send the whole list next time (after editing old messages in place)."""
        self.sender.reset()

    def call(
        self, call: Call[T], messages: Messages, features: Collection[str], *, owned: bool = False
    ) -> Call[T]:
        """``call`` (built with no messages) for ``messages``, by delta when enabled.

        ``features`` is what the daemon supports (ping's ``features``); only
        what it names is asked for. ``messages`` must stay as it is until the
        reply is in (its view is rebuilt from it): task handles pass a copy
        taken when called. With ``owned`` (that copy, which nothing changes
        afterwards) the record of what was sent keeps it instead of copying it again.
        """
        if self.enabled and DELTA not in features:
            self.enabled = False  # a daemon without delta sync
            self.sender.reset()
        if VIEW_PATCH_PREPEND in features:
            self.view = "patch_prepend"
        else:
            self.view = "patch" if VIEW_PATCH in features else None
        self.skip = VIEW_PATCH_SKIP in features
        return self._call(call, messages, owned)

    def _call(self, call: Call[T], messages: Messages, owned: bool) -> Call[T]:
        if not self.enabled:
            return _with_history(call, {"messages": copy_messages(messages)})
        history = self.sender.args_for(messages)
        sender, patches = self.sender, self.patches

        def sending() -> None:
            sender.prepare(messages, history)

        def finish(result: dict[str, Any]) -> dict[str, Any]:
            patch = result.pop("patch", None)
            if patch is not None:
                result["messages"] = patches.apply(messages, patch)
            elif "messages" in result:
                patches.took_whole()
            sender.sent(messages, history, owned=owned)
            return result

        asked: dict[str, Any] = dict(history)
        if self.view is not None:
            asked["view"] = self.view
            if patches.token is not None:
                asked["patch_base"] = patches.token
            if self.skip:
                asked["patch_skip"] = True
        return _with_history(call, asked, finish, sending)

    def retry(
        self, call: Call[T], messages: Messages, error: CtxwinError, *, owned: bool = False
    ) -> Call[T] | None:
        """The request to send after ``error``, or None when the error stands.

        Only ``resync_required`` is retried: the daemon no longer holds the
        base of the delta, so the whole list goes.
        """
        if not self.enabled or error.code != ErrorCode.RESYNC_REQUIRED.value:
            return None
        self.sender.reset()
        return self._call(call, messages, owned)


def _with_history(
    call: Call[T],
    history: Mapping[str, Any],
    finish: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    sending: Callable[[], None] | None = None,
) -> Call[T]:
    args = {name: value for name, value in call.args.items() if name != "messages"}
    args.update(history)
    validate(call.op, args)
    return Call(call.op, args, finish, call.timeout, sending)
