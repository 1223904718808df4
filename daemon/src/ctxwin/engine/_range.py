"""The next range of messages to drop (SPEC.md §3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

Keep = Literal["none", "lastTwo", "half", "quarter"]
FIRST_REMOVABLE = 2


def next_truncation_range(
    messages: Sequence[Mapping[str, Any]],
    deleted_range: Sequence[int] | None,
    keep: Keep | str,
) -> list[int]:
    """Grow the deleted range so that only ``keep`` of the rest stays (SPEC.md §3).

    Args:
        messages: the task's full history.
        deleted_range: the current range ``[2, end]`` or None.
        keep: ``none``, ``lastTwo``, ``half`` or ``quarter``.

    Returns:
        The new inclusive range ``[2, end]``; it ends on an assistant message
        when it can and may be empty (``[2, 1]``).

    Raises:
        ValueError: for an unknown ``keep``.
    """
    rest = deleted_range[1] + 1 if deleted_range else FIRST_REMOVABLE
    n = len(messages) - rest
    if keep == "none":
        remove = max(n, 0)
    elif keep == "lastTwo":
        remove = max(n - 2, 0)
    elif keep == "half":
        remove = (n // 4) * 2
    elif keep == "quarter":
        remove = ((n * 3) // 8) * 2  # floor(n * 3 / 4 / 2), exact in integers
    else:
        raise ValueError(f"unknown keep strategy {keep!r}")
    end = rest + remove - 1
    if 0 <= end < len(messages) and messages[end].get("role") != "assistant":
        end -= 1
    # A history of fewer than 3 messages, or a user message at index 1, can take
    # the end below 1; every such range is the empty one, [2, 1] (the one rule,
    # proto.deleted_range_error, refuses the others).
    return [FIRST_REMOVABLE, max(end, FIRST_REMOVABLE - 1)]
