"""What the tests' own servers share: started on entering a ``with`` block, stopped on leaving."""

from __future__ import annotations

import abc
import signal
import subprocess
from typing import Self


class Service(abc.ABC):
    """A server a test starts on entering a ``with`` block and stops on leaving it."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start serving; return once it is ready."""

    @abc.abstractmethod
    def stop(self) -> object:
        """Stop serving and release what it holds."""

    def leave(self, failing: bool) -> None:
        """Stop on leaving the block; ``failing`` when the block raised."""
        self.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.leave(failing=exc_info[0] is not None)


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM a running child, wait (SIGKILL after ``timeout``); its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
