"""The sd_notify protocol: readiness, status, watchdog and stopping messages to systemd.

The protocol is one datagram of newline-separated ``KEY=VALUE`` fields sent to the
``AF_UNIX`` socket named by ``NOTIFY_SOCKET`` (a path, or an abstract-namespace
name when it starts with ``@``). Outside systemd that variable is unset and every
method here does nothing. A failed send is logged at debug level and otherwise
ignored: telling systemd about the daemon must never stop the daemon.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import structlog

__all__ = ["Notifier", "running_under_systemd"]

_log = structlog.get_logger("ctxwin.daemon.notify")

# Variables systemd sets for the main process only; children must not see them,
# or a child could send READY=1 / WATCHDOG=1 on the daemon's behalf.
_NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

# Bounded so a receiver that stops reading cannot block the event loop for long;
# a unix datagram sender otherwise blocks once the receiver's queue is full.
_SEND_TIMEOUT_S = 1.0


def running_under_systemd(environ: Mapping[str, str] | None = None) -> bool:
    """Tell whether the process was started by systemd as (part of) a unit.

    systemd sets ``INVOCATION_ID`` for every unit it starts and ``JOURNAL_STREAM``
    when stdout or stderr is connected to the journal; either is taken as a sign
    that output goes to journald, where one JSON object per line reads best.

    Args:
        environ: the environment to look at; ``os.environ`` when omitted.

    Returns:
        True when ``INVOCATION_ID`` or ``JOURNAL_STREAM`` is set and non-empty.
    """
    env = os.environ if environ is None else environ
    return bool(env.get("INVOCATION_ID") or env.get("JOURNAL_STREAM"))


def _socket_address(value: str) -> str | None:
    """Turn a ``NOTIFY_SOCKET`` value into an address for ``socket.sendto``.

    Returns None for values this module cannot use (empty, relative, or a
    transport other than ``AF_UNIX``).
    """
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


def _positive_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number > 0 else None


class Notifier:
    """Sends sd_notify messages to the service manager, or nothing outside systemd.

    Build it with :meth:`from_environ` early at start-up, before any child
    process is spawned, so the notification variables are not inherited.
    """

    __slots__ = ("_address", "_watchdog_pid", "_watchdog_usec")

    def __init__(
        self,
        address: str | None = None,
        *,
        watchdog_usec: int | None = None,
        watchdog_pid: int | None = None,
    ) -> None:
        """Create a notifier for one notification socket.

        Args:
            address: the ``NOTIFY_SOCKET`` value (``/path`` or ``@abstract``);
                None, or a value that is not an ``AF_UNIX`` address, disables it.
            watchdog_usec: the ``WATCHDOG_USEC`` value, if any.
            watchdog_pid: the ``WATCHDOG_PID`` value, if any; the watchdog is only
                ours when it is None or equals this process's pid.
        """
        self._address = _socket_address(address) if address else None
        if address and self._address is None:
            _log.debug("notify_socket_unsupported", notify_socket=address)
        self._watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._watchdog_pid = watchdog_pid

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """Build a notifier from ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``.

        The three variables are removed from ``os.environ`` (when reading from it)
        so that processes started later do not inherit them.

        Args:
            environ: where to read the variables; ``os.environ`` when omitted.
                A mapping other than ``os.environ`` is read and left unchanged.

        Returns:
            The notifier; disabled when ``NOTIFY_SOCKET`` is unset or unusable.
        """
        source = os.environ if environ is None else environ
        address = source.get("NOTIFY_SOCKET") or None
        watchdog_usec = _positive_int(source.get("WATCHDOG_USEC"))
        raw_pid = source.get("WATCHDOG_PID")
        # A WATCHDOG_PID that does not parse names nobody we know: pid 0 never matches.
        watchdog_pid = None if raw_pid is None else (_positive_int(raw_pid) or 0)
        if environ is None or environ is os.environ:
            for name in _NOTIFY_VARIABLES:
                os.environ.pop(name, None)
        return cls(address, watchdog_usec=watchdog_usec, watchdog_pid=watchdog_pid)

    @property
    def enabled(self) -> bool:
        """True when there is a notification socket to send to."""
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or None.

        None when notifications are disabled, no watchdog is configured, or
        ``WATCHDOG_PID`` names another process.
        """
        if self._address is None or self._watchdog_usec is None:
            return None
        if self._watchdog_pid is not None and self._watchdog_pid != os.getpid():
            return None
        return self._watchdog_usec / 2_000_000

    def ready(self) -> None:
        """Send ``READY=1``: start-up is complete and the daemon serves requests."""
        self.notify("READY=1")

    def status(self, text: str) -> None:
        """Send ``STATUS=text``, shown by ``systemctl status``.

        Args:
            text: one line of free text; line breaks are replaced by spaces.
        """
        self.notify("STATUS=" + " ".join(text.splitlines()))

    def stopping(self) -> None:
        """Send ``STOPPING=1``: shutdown has begun."""
        self.notify("STOPPING=1")

    def watchdog(self) -> None:
        """Send ``WATCHDOG=1``, unless the watchdog is not configured for this process."""
        if self.watchdog_interval is not None:
            self.notify("WATCHDOG=1")

    def notify(self, *fields: str) -> None:
        """Send one message made of ``KEY=VALUE`` fields, one per line.

        Does nothing when disabled or given no fields; a failed send is logged at
        debug level and ignored.

        Args:
            *fields: the fields, e.g. ``"READY=1"``, ``"STATUS=serving"``.
        """
        if self._address is None or not fields:
            return
        message = "\n".join(fields).encode("utf-8", errors="replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.settimeout(_SEND_TIMEOUT_S)
                sock.sendto(message, self._address)
        except OSError as exc:
            _log.debug("notify_failed", fields=[f.split("=", 1)[0] for f in fields], error=str(exc))

    def __repr__(self) -> str:
        address = self._address
        if address is not None and address.startswith("\0"):
            address = "@" + address[1:]
        return (
            f"Notifier(address={address!r}, watchdog_usec={self._watchdog_usec!r}, "
            f"watchdog_pid={self._watchdog_pid!r})"
        )
