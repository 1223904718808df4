"""What a strategy is given and gives back (docs/STRATEGIES.md).

A strategy (``_strategy.py``'s ``default`` and ``fit``, ``_auto.py``'s ``auto``)
takes a task's state and the :class:`Request`, makes its edits on the state
and returns the result with the view to send: :func:`prepared` builds it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ctxwin.proto import PrepareRequestResult

from ._blocks import Message, wire_view
from ._budget import Budgeting, largest_messages, view_origins
from ._ledger import Receipt

__all__ = ["Request", "RequestTask", "ViewStrategy", "prepared"]

Task = TypeVar("Task", contravariant=True)
"""The task state a strategy takes (the protocol of what it uses)."""


class RequestTask(Protocol):
    """What :func:`prepared` uses of a task's state (``TaskState`` has it)."""

    @property
    def deleted_range(self) -> list[int] | None:
        """The inclusive ``[2, end]`` range of messages not sent, or None."""
        ...

    @property
    def dropped(self) -> tuple[tuple[int, int], ...]:
        """The deleted set's ranges."""
        ...

    def truncated_messages(self, messages: Sequence[Message]) -> list[Message]:
        """The view of ``messages``."""
        ...


@dataclass(slots=True)
class Request:
    """The next request, as ``prepare_request`` was asked about it.

    Attributes:
        messages: the task's full history.
        previous_request: the last request's usage ``{ts, tokens_*}``, or None.
        model: the model of the next request.
        use_auto_condense: the agent condenses by summary; never cut here.
        budgeting: the request's estimation settings, None when it asked for none
            (SPEC.md's behaviour exactly).
        ts: the time stamped on edits made without a previous request.
    """

    messages: Sequence[Message]
    previous_request: Mapping[str, Any] | None
    model: Mapping[str, Any]
    use_auto_condense: bool = False
    budgeting: Budgeting | None = None
    ts: int | None = None


class ViewStrategy(Protocol[Task]):
    """What decides, before a request, whether and how the view changes."""

    def prepare(
        self, state: Task, request: Request
    ) -> tuple[PrepareRequestResult, Sequence[Receipt]]:
        """Edit ``state`` for ``request`` (a change to write bumps its revision); the
        result with the view to send, and the receipts of the edits made."""
        ...


def prepared(
    state: RequestTask,
    messages: Sequence[Message],
    range_updated: bool,
    stalled: bool,
    limit: float,
    budgeting: Budgeting | None,
    view: list[Message] | None = None,
    estimated: int | None = None,
) -> PrepareRequestResult:
    """The result with the view of ``state``; with ``budgeting``, the view's estimate
    against ``limit`` and its largest messages when it does not fit.

    ``view`` and ``estimated``: the view of ``state`` and its estimate when the strategy
    built and counted it already (not built nor counted again)."""
    if view is None:
        view = state.truncated_messages(messages)
        estimated = None
    result: PrepareRequestResult = {
        "deleted_range": state.deleted_range,
        "range_updated": range_updated,
        "messages": wire_view(view),
        "stalled": stalled,
    }
    if budgeting is not None:
        if estimated is None:
            estimated = budgeting.view_tokens(view)
        result["estimated_tokens"] = estimated
        result["fits"] = estimated <= limit
        if estimated > limit:
            origins = view_origins(len(messages), state.deleted_range, state.dropped)
            result["largest"] = largest_messages(view, origins, budgeting)
    return result
