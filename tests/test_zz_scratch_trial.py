"""Scratch: the throwaway op answers over the real wire."""

from __future__ import annotations

import pytest

from ctxwin.client import AsyncClient, Client
from tests._daemon import DaemonProcess

MESSAGES = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


def test_revision_op(daemon: DaemonProcess) -> None:
    """Both clients and both handles call the new op."""
    with Client(daemon.endpoint) as client:
        task = client.task("trial1")
        task.truncated_messages(MESSAGES)
        assert isinstance(task.revision()["revision"], int)
        assert isinstance(client.revision("trial1")["revision"], int)


@pytest.mark.anyio
async def test_revision_op_async(daemon: DaemonProcess) -> None:
    """The async twin too."""
    async with AsyncClient(daemon.endpoint) as client:
        assert isinstance((await client.task("trial2").revision())["revision"], int)
        assert isinstance((await client.revision("trial2"))["revision"], int)
