"""Accepting connections one at a time, only while descriptors are left.

libzmq 4.3.5 aborts the whole process when an ipc listener's ``accept()``
fails with EMFILE (its tcp listener retries in a busy loop instead). The gate
switches each listener's epoll registration inside libzmq to one-shot, so
that libzmq accepts one connection per arming, and re-arms it only while the
open-files limit leaves room. Clients past the limit wait in the listen
backlog; nobody is disconnected.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import platform
import resource
import select
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

import structlog
import zmq

from ._logging import Throttle

__all__ = ["FD_RESERVE", "MIN_CLIENTS", "AcceptGate", "soft_open_files_limit"]

_log = structlog.get_logger("ctxwin.daemon.accept")

# Descriptors kept free for state files, the log and the gate's own checks.
FD_RESERVE = 16
# Below this many clients' worth of descriptors the daemon refuses to start.
MIN_CLIENTS = 8
# Above this much estimated room the gate trusts its count of connections; below
# it, it counts /proc/self/fd (about 30 us per 100 descriptors).
_EXACT_BELOW_ROOM = 1024
_RECHECK_S = 0.1
_PAUSE_LOG_INTERVAL_S = 10.0
_FIND_LISTENER_S = 2.0
_EPOLL_CTL_MOD = 3
_GATE_EVENTS = (
    zmq.EVENT_LISTENING | zmq.EVENT_ACCEPTED | zmq.EVENT_ACCEPT_FAILED | zmq.EVENT_DISCONNECTED
)


class _PackedEpollEvent(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("events", ctypes.c_uint32), ("data", ctypes.c_uint64))


class _EpollEvent(ctypes.Structure):
    _fields_ = (("events", ctypes.c_uint32), ("data", ctypes.c_uint64))


# glibc packs struct epoll_event on x86-64 only.
_EPOLL_EVENT: type[ctypes.Structure] = (
    _PackedEpollEvent if platform.machine().lower() in ("x86_64", "amd64") else _EpollEvent
)


@dataclass(frozen=True)
class _Listener:
    """A listening descriptor of libzmq's and its registration in libzmq's epoll."""

    endpoint: str
    fd: int
    epoll_fd: int
    data: int


def _open_descriptors() -> int:
    """How many descriptors this process has open (0 where the system does not say)."""
    for directory in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(directory)) - 1  # less the one listdir used
        except OSError:
            continue
    return 0


def soft_open_files_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 30 if soft == resource.RLIM_INFINITY else soft


def _find_registration(fd: int) -> tuple[int, int] | None:
    """The epoll descriptor watching ``fd`` for input, and the data it reports, or None.

    Read from ``/proc/self/fdinfo``: an epoll descriptor lists each watched
    descriptor as ``tfd: <fd> events: <hex> data: <hex> ... ino:<hex>``.
    """
    inode = os.fstat(fd).st_ino
    for name in os.listdir("/proc/self/fdinfo"):
        try:
            with open(f"/proc/self/fdinfo/{name}") as info:
                lines = [line for line in info if line.startswith("tfd:")]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            try:
                tfd, events, data = int(fields[1]), int(fields[3], 16), int(fields[5], 16)
                ino = next(int(f[4:], 16) for f in fields if f.startswith("ino:"))
            except (IndexError, ValueError, StopIteration):
                continue
            if tfd == fd and ino == inode and events & select.EPOLLIN:
                return int(name), data
    return None


class AcceptGate:
    """Lets libzmq accept one connection at a time, and only while descriptors are left.

    libzmq 4.3.5 aborts the process when ``accept()`` on an ipc listener fails
    with EMFILE (``ipc_listener.cpp`` asserts on it; the TCP listener tolerates
    it, then retries in a busy loop until a descriptor is free). libzmq accepts
    whenever its epoll reports a listener readable, so the gate turns that
    registration into ``EPOLLONESHOT``: each report lets libzmq accept one
    connection, then the listener stays quiet until the gate re-arms it. A
    socket monitor reports every accept and disconnect; the gate re-arms the
    listeners while at least ``reserve`` descriptors (plus two per listener,
    what one round of re-arming can cost) are free under the soft
    ``RLIMIT_NOFILE``, and otherwise looks again every 100 ms. Clients past the
    limit wait in the listen backlog, or retry their connect, and get in as
    others leave.

    The registration is read from libzmq's epoll descriptor in
    ``/proc/self/fdinfo`` (the listener's descriptor comes with the monitor's
    LISTENING event) and changed with ``epoll_ctl`` keeping libzmq's data.
    libzmq sets a listener's registration once, when the listener starts, and
    removes it when the listener closes, which only happens when the socket
    closes, after :meth:`close`. Where the registration cannot be found (not
    Linux, a libzmq without epoll) that listener is left as libzmq made it and
    a warning is logged.
    """

    def __init__(self, socket: zmq.Socket[bytes], reserve: int = FD_RESERVE) -> None:
        self.socket = socket
        self.reserve = reserve
        self.loop = asyncio.get_running_loop()
        self.listeners: list[_Listener] = []
        self._listening: list[tuple[str, int]] = []
        self.live = 0  # connections accepted and not yet disconnected
        self._base = 0  # descriptors open besides the connections
        self.paused = False
        self.pauses = 0
        self._pause_log = Throttle(_PAUSE_LOG_INTERVAL_S)
        self._timer: asyncio.TimerHandle | None = None
        self._reading = False
        self._closed = False
        self._libc: ctypes.CDLL | None = None
        address = f"inproc://ctxwind-accept-gate-{id(self):x}"
        socket.monitor(address, _GATE_EVENTS)
        self.monitor: zmq.Socket[bytes] = socket.context.socket(zmq.PAIR)
        # Unbounded: at the bound libzmq's I/O thread would block on the next event.
        self.monitor.setsockopt(zmq.RCVHWM, 0)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.connect(address)
        fd = self.monitor.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd

    def _events(self) -> Iterator[tuple[int, int, str]]:
        """The monitor's pending events: (event, value, endpoint)."""
        while True:
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event, value = struct.unpack_from("=HI", frames[0])
            yield event, value, frames[1].decode(errors="replace") if len(frames) > 1 else ""

    def start(self) -> None:
        """Gate every listener bound so far and start following the monitor."""
        self._drain()
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
        except OSError as exc:
            _log.warning("accept_gate_unavailable", reason=f"no C library: {exc}")
        deadline = time.monotonic() + _FIND_LISTENER_S
        for endpoint, fd in self._listening:
            found = None
            while self._libc is not None:
                try:
                    found = _find_registration(fd)
                except OSError as exc:
                    _log.warning("accept_gate_unavailable", endpoint=endpoint, reason=str(exc))
                    break
                if found is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.001)  # libzmq's I/O thread registers a new listener at once
            if found is None:
                if self._libc is not None:
                    _log.warning(
                        "accept_gate_unavailable",
                        endpoint=endpoint,
                        reason="no epoll registration of the listener in /proc/self/fdinfo",
                    )
                continue
            listener = _Listener(endpoint, fd, *found)
            try:
                self._arm(listener)
            except OSError as exc:
                _log.warning("accept_gate_unavailable", endpoint=endpoint, reason=str(exc))
                continue
            self.listeners.append(listener)
        self._listening.clear()
        self._base = _open_descriptors() - self.live
        self.loop.add_reader(self._fd, self._on_events)
        self._reading = True
        self._on_events()

    def room(self) -> int:
        """Descriptors free under the soft open-files limit (an estimate when far from it)."""
        limit = soft_open_files_limit()
        room = limit - self._base - self.live
        if room >= _EXACT_BELOW_ROOM:
            return room
        open_now = _open_descriptors()
        self._base = open_now - self.live  # counts drift: handovers close without an event
        return limit - open_now

    def close(self) -> None:
        """Stop gating (before the socket closes) and drop the monitor."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._reading:
            self.loop.remove_reader(self._fd)
            self._reading = False
        with contextlib.suppress(zmq.ZMQError):
            self.socket.disable_monitor()
        self.monitor.close(linger=0)

    def _drain(self) -> bool:
        """Take the monitor's events; whether any was an accept or a disconnect."""
        changed = False
        for event, value, endpoint in self._events():
            if event == zmq.EVENT_LISTENING:
                self._listening.append((endpoint, value))
            elif event == zmq.EVENT_ACCEPTED:
                self.live += 1
                changed = True
            elif event == zmq.EVENT_DISCONNECTED:
                self.live = max(0, self.live - 1)
                changed = True
            elif event == zmq.EVENT_ACCEPT_FAILED:
                changed = True
        return changed

    def _on_events(self) -> None:
        if self._drain() and not self._closed:
            self._admit()

    def _admit(self) -> None:
        """Re-arm the listeners if descriptors allow, else look again shortly."""
        if self._timer is not None:
            self._timer.cancel()  # a no-op when the timer is what called
            self._timer = None
        if self._closed or not self.listeners:
            return
        room = self.room()
        if room >= self.reserve + 2 * len(self.listeners):
            for listener in self.listeners:
                try:
                    self._arm(listener)
                except OSError as exc:
                    _log.error("accept_gate_failed", endpoint=listener.endpoint, error=str(exc))
            if self.paused:
                self.paused = False
                _log.info("accept_resumed", room=room, clients=self.live)
            return
        if not self.paused:
            self.paused = True
            self.pauses += 1
            if self._pause_log.due():
                _log.warning(
                    "accept_paused",
                    reason="open-files limit",
                    limit=soft_open_files_limit(),
                    room=room,
                    clients=self.live,
                    pauses=self.pauses,
                )
        self._timer = self.loop.call_later(_RECHECK_S, self._admit)

    def _arm(self, listener: _Listener) -> None:
        """Let libzmq accept one connection on ``listener`` (``epoll_ctl`` MOD, one-shot)."""
        assert self._libc is not None
        event = _EPOLL_EVENT(select.EPOLLIN | select.EPOLLONESHOT, listener.data)
        if self._libc.epoll_ctl(
            listener.epoll_fd, _EPOLL_CTL_MOD, listener.fd, ctypes.byref(event)
        ):
            code = ctypes.get_errno()
            raise OSError(code, f"epoll_ctl: {os.strerror(code)}")
