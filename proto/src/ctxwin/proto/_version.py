from __future__ import annotations

PROTOCOL_VERSION = 1
"""Wire protocol version carried as ``v`` in every request and reply."""

__version__ = "0.1.0"
