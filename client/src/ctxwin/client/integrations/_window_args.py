"""The window options every adapter takes, written (and documented) once.

Each adapter takes ``**options: Unpack[WindowArgs]`` under :func:`takes_window_args`,
which shows them in its signature and documents in its ``Args:`` those it does
not document itself (an adapter says how it derives task ids, say).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

if TYPE_CHECKING:
    from ._conversations import Turn

__all__ = ["WindowArgs", "takes_window_args"]

T = TypeVar("T", bound=Callable[..., object])


class WindowArgs(TypedDict, total=False):
    """What every adapter's window is made of, besides the adapter's own arguments.

    Attributes:
        task: the ctxwin task id for every conversation; None derives one per
            conversation from its head, stable across restarts.
        context_window: the model's window in tokens; None takes the model's
            known window, else the daemon's default.
        endpoint: the ctxwin daemon's endpoint (default: ``$CTXWIN_ENDPOINT``,
            else the default endpoint).
        on_turn: called with a :class:`~ctxwin.client.integrations.Turn` after
            each model request (range, tokens, fits, stalled, retried, usage).
        ephemeral: keep the tasks in the daemon's memory only: nothing is
            written, and a task left idle is dropped (examples, one-off runs).
        summaries: ``"model"``: when a summary is due (the last request used
            0.75 of the window), the model is asked for one and ctxwin cuts the
            turns it stands for; ``"basic"``: ctxwin writes the summary itself;
            None: cut without one (docs/SUMMARIES.md).
    """

    task: str | None
    context_window: int | None
    endpoint: str | None
    on_turn: Callable[[Turn], None] | None
    ephemeral: bool
    summaries: str | None


DEFAULTS: dict[str, object] = {"ephemeral": False}
"""Each option's default where it is not None."""


def _entries(doc: str, section: str) -> tuple[list[str], dict[str, list[str]], int, int]:
    """The lines of ``doc``, its ``section``'s entries by name (their lines), and where
    the section's entries end and at what indentation they stand (-1, -1: no section)."""
    lines = inspect.cleandoc(doc).split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == f"{section}:"), -1)
    if start < 0:
        return lines, {}, -1, -1
    indent = len(lines[start]) - len(lines[start].lstrip()) + 4
    entries: dict[str, list[str]] = {}
    end = start + 1
    name = ""
    while end < len(lines):
        line = lines[end]
        depth = len(line) - len(line.lstrip())
        if line.strip() and depth < indent:
            break
        found = re.match(r"(\w+): ", line[indent:]) if depth == indent else None
        if found:
            name = found.group(1)
            entries[name] = []
        if name:
            entries[name].append(line[indent:])
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return lines, entries, end, indent


_SHARED = _entries(WindowArgs.__doc__ or "", "Attributes")[1]


def takes_window_args(target: T) -> T:
    """Show the ``**options`` of ``target`` (a function, or a class's ``__init__``) as the
    keyword arguments of :class:`WindowArgs`, and document in its ``Args:`` those it does
    not document itself.

    Raises:
        ValueError: the docstring has no ``Args:`` section.
    """
    function: Any = target.__init__ if isinstance(target, type) else target  # type: ignore[misc]
    signature = inspect.signature(function)
    kept = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    named = {p.name for p in kept}
    added = [
        inspect.Parameter(
            name,
            inspect.Parameter.KEYWORD_ONLY,
            default=DEFAULTS.get(name),
            annotation=getattr(hint, "__forward_arg__", hint),
        )
        for name, hint in WindowArgs.__annotations__.items()
        if name not in named
    ]
    function.__signature__ = signature.replace(parameters=[*kept, *added])
    lines, own, end, indent = _entries(target.__doc__ or "", "Args")
    if end < 0:
        raise ValueError(f"{target.__qualname__}: no Args: section to document the options in")
    shared = [
        " " * indent + line
        for name in WindowArgs.__annotations__
        if name not in own
        for line in _SHARED[name]
    ]
    target.__doc__ = "\n".join([*lines[:end], *shared, *lines[end:]])
    return target
