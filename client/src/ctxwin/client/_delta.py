"""Delta sync: send what a turn adds, get views back as patches (DESIGN.md, delta sync)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ctxwin import proto
from ctxwin.proto import ErrorCode

from ._core import Call, Messages, copy_messages, validate
from ._errors import CtxwinError

T = TypeVar("T")


class DeltaSync:
    """A task handle's delta sync with the daemon (DESIGN.md, delta sync).

    After the first full list, history ops send ``base``/``base_digest``/``append``
    and ask for views as patches, which are applied to the caller's own list.
    When the daemon answers ``resync_required`` the whole list goes once
    more; a daemon without delta sync (it refuses the fields) turns it off.
    """

    __slots__ = ("enabled", "patches", "sender", "view")

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.sender = proto.DeltaSender()
        self.patches = proto.PatchReceiver()
        # Patches with ``prepend`` entries; plain ones from a daemon that refuses the form.
        self.view = "patch_prepend"

    def reset(self) -> None:
        """Send the whole list next time (after editing old messages in place)."""
        self.sender.reset()

    def call(self, call: Call[T], messages: Messages, *, owned: bool = False) -> Call[T]:
        """``call`` (built with no messages) for ``messages``, by delta when enabled.

        ``messages`` must stay as it is until the reply is in (its view is
        rebuilt from it): task handles pass a copy taken when called. With
        ``owned`` (that copy, which nothing changes afterwards) the record of
        what was sent keeps it instead of copying it again.
        """
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

        asked: dict[str, Any] = {**history, "view": self.view}
        if patches.token is not None:
            asked["patch_base"] = patches.token
        return _with_history(call, asked, finish, sending)

    def retry(
        self, call: Call[T], messages: Messages, error: CtxwinError, *, owned: bool = False
    ) -> Call[T] | None:
        """The request to send after ``error``, or None when the error stands."""
        if not self.enabled:
            return None
        if error.code == ErrorCode.RESYNC_REQUIRED.value:
            self.sender.reset()
            return self.call(call, messages, owned=owned)
        refused = error.code == ErrorCode.BAD_REQUEST.value and not error.local
        if refused and self.view != "patch" and "view must be one of" in error.message:
            self.view = "patch"  # a daemon without the prepend form
            return self.call(call, messages, owned=owned)
        if refused and "unknown argument" in error.message:  # a daemon without delta sync
            self.enabled = False
            self.sender.reset()
            return self.call(call, messages, owned=owned)
        return None


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
