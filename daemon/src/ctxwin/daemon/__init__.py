"""ctxwind: the ZeroMQ server, task actors, persistence and configuration.

What a user of the daemon needs: run it (:func:`main`, or :func:`run_daemon`
with a :class:`Config` from :func:`load_config`), read its ``stats``
(:class:`ctxwin.proto.StatsResult`) and count tokens as it does (:class:`TokenCounter`).
The rest is internal.
"""

from __future__ import annotations

from ._config import NOTICE_ENV, Config, ConfigError
from ._config_sources import load_config
from ._errors import StartupError
from ._lifecycle import run_daemon
from ._logging import configure_logging
from ._main import main
from ._tokens import IMAGE_TOKENS, TokenCounter

__all__ = [
    "IMAGE_TOKENS",
    "NOTICE_ENV",
    "Config",
    "ConfigError",
    "StartupError",
    "TokenCounter",
    "configure_logging",
    "load_config",
    "main",
    "run_daemon",
]
