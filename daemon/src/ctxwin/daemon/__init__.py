"""ctxwind: the ZeroMQ server, task actors, persistence and configuration."""

from __future__ import annotations

from ._actors import ActorStoppedError, ActorSystem, BusyError, Counters, FlushError, TaskActor
from ._config import NOTICE_ENV, Config, ConfigError, load_config
from ._logging import configure_logging
from ._main import main
from ._persist import TaskFiles, acquire_lock, write_atomic
from ._server import DaemonStatistics, Server, StartupError, run_daemon
from ._tokens import IMAGE_TOKENS, TokenCounter

__all__ = [
    "IMAGE_TOKENS",
    "NOTICE_ENV",
    "ActorStoppedError",
    "ActorSystem",
    "BusyError",
    "Config",
    "ConfigError",
    "Counters",
    "DaemonStatistics",
    "FlushError",
    "Server",
    "StartupError",
    "TaskActor",
    "TaskFiles",
    "TokenCounter",
    "acquire_lock",
    "configure_logging",
    "load_config",
    "main",
    "run_daemon",
    "write_atomic",
]
