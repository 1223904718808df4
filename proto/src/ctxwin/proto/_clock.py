"""The wire's clock: ``ts`` values are milliseconds since the epoch (DESIGN.md "Wire protocol")."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch, as every ``ts`` on the wire."""
    return time.time_ns() // 1_000_000
