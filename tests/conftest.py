from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._daemon import DaemonProcess


@pytest.fixture
def anyio_backend() -> str:
    """pyzmq's asyncio support means asyncio only."""
    return "asyncio"


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A real ctxwind subprocess on a private ipc endpoint and state dir."""
    process = DaemonProcess(tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()
