"""The asyncio client's socket: one DEALER to the daemon, many requests in flight.

:class:`AsyncSocket` only moves bytes and waits: it makes the socket on first
use (and again after it was dropped), hands each reply to the call waiting
for its id, and follows the socket's monitor, dropping the socket when the
connection goes away so that nothing queued on it reaches a daemon later.
What a reply means (retries, referrals) is the client's (``_async.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from ctxwin.proto import Reply

from . import _autostart, _core, _link
from ._core import Call
from ._errors import ClientClosedError, DaemonUnavailableError, RequestTimeoutError

__all__ = ["AsyncSocket"]


class AsyncSocket:
    """The socket of an :class:`~ctxwin.client.AsyncClient`.

    Attributes:
        owner: the client, whose endpoint, keys and settings it connects with.
        context: the ZeroMQ asyncio context.
        link: the connection as the socket's monitor reports it.
        pending: the calls waiting for a reply, by request id.
    """

    def __init__(self, owner: _link.SocketOwner, context: zmq.asyncio.Context) -> None:
        self.owner = owner
        self.context = context
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._monitor_now: zmq.Socket[bytes] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.link = _link.Link()
        self.pending: dict[int, asyncio.Future[Reply]] = {}
        self._ids = itertools.count(1)
        self._connecting: asyncio.Lock | None = None
        self.closed = False

    @property
    def connected(self) -> bool:
        """Whether a socket is open (what :attr:`link` says is about that socket)."""
        return self._socket is not None

    async def move_to(self, endpoint: str, deadline: float) -> None:
        """Move the client to ``endpoint``, once the calls in flight on this socket are answered."""
        waiting = [future for future in self.pending.values() if not future.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
        if self.owner.endpoint != endpoint:
            self.drop()
            self.owner.endpoint = endpoint

    def turn(self, op: str, budget: float) -> contextlib.AbstractAsyncContextManager[None]:
        """Nothing to wait for: any number of calls may be in flight on this socket."""
        return contextlib.nullcontext()

    async def aclose(self) -> None:
        """Close for good: drop the socket, fail the calls waiting, wait for its readers."""
        self.closed = True
        tasks = self.drop()
        if tasks and tasks[0].get_loop() is asyncio.get_running_loop():
            # Wait for the readers to end without taking a cancellation of our own caller.
            await asyncio.wait(tasks)

    def close(self) -> None:
        """Close for good now, from any thread or loop (or none), not waiting for the readers."""
        self.closed = True
        self.drop()

    def drop(self, reason: Exception | None = None) -> list[asyncio.Task[None]]:
        """Close the socket, stop its readers, fail the calls still waiting on it."""
        tasks = [task for task in (self._reader, self._watcher) if task is not None]
        self._reader = self._watcher = None
        _link.close_dealer(self._socket, self._monitor)
        self._socket = self._monitor = self._monitor_now = None
        for task in tasks:
            if not task.get_loop().is_closed():
                task.cancel()
        for future in self.pending.values():
            if not future.done():
                future.set_exception(reason or ClientClosedError("the client was closed"))
        self.pending.clear()
        return tasks

    async def _connect(self) -> zmq.asyncio.Socket:
        if self.closed:
            raise ClientClosedError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._reader is not None and self._reader.get_loop() is not loop:
            self.drop()  # first used on another loop, now gone
            self._connecting = None
        if self._socket is not None:
            return self._socket
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._socket is None:
                if self.owner.autostart:
                    await loop.run_in_executor(None, _autostart.ensure_daemon, self.owner.endpoint)
                    if self.closed:
                        raise ClientClosedError("the client is closed")
                sock, monitor, curve = _link.open_dealer(
                    self.context, self.owner.endpoint, self.owner.curve
                )
                self._socket, self._monitor = sock, monitor
                self._monitor_now = zmq.Socket.shadow(monitor.underlying)
                self.link.fresh(curve)
                self._reader = loop.create_task(self._read(sock))
                self._watcher = loop.create_task(self._watch(sock, monitor))
            return self._socket

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        """Hand each reply to the caller waiting for its id, for as long as the socket lives."""
        try:
            while True:
                frames = await sock.recv_multipart()
                reply = _core.decode(frames)
                if reply is None:
                    continue
                target = _core.reply_target(reply, self.pending.keys())
                future = self.pending.get(target) if target is not None else None
                if future is not None and not future.done():
                    future.set_result(reply)
        except zmq.ZMQError as exc:
            # The socket broke under us: fail the waiting calls, let the next one reconnect.
            if self._socket is sock:
                self._reader = None
                self.drop(
                    DaemonUnavailableError(f"receiving failed: {exc}", endpoint=self.owner.endpoint)
                )

    async def _watch(self, sock: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        """Follow the socket's connection; when it drops or nothing answers, start over.

        The socket is dropped either way, so that nothing queued on it reaches a
        daemon later: calls in flight get :class:`~ctxwin.client._link.Dropped`
        (the caller resends what is safe to repeat) or the unreachable error.
        """
        try:
            while self._socket is sock:
                event = parse_monitor_message(await monitor.recv_multipart())
                now = time.monotonic()
                self.link.feed(event["event"], now)
                if self.link.handshake is not None:  # refused: nothing was sent
                    self._watcher = None
                    self.drop(_link.handshake_error(self.owner.endpoint, self.link))
                elif self.link.dropped:
                    self._watcher = None
                    self.drop(_link.Dropped())
                elif self.pending and self.link.unreachable(now):
                    self._watcher = None
                    self.drop(_link.unreachable_error(self.owner.endpoint, self.link))
        except zmq.ZMQError:
            pass  # the monitor was closed with its socket

    def _catch_up(self) -> None:
        """Take the monitor's events so far, now: a drop before a call is not that call's."""
        now = self._monitor_now  # the monitor, read without the event loop
        while now is not None and now.poll(0, zmq.POLLIN):
            self.link.feed(parse_monitor_message(now.recv_multipart())["event"], time.monotonic())
        if self.link.handshake is not None:
            self.drop(_link.handshake_error(self.owner.endpoint, self.link))
        elif self.link.dropped:
            self.drop(_link.Dropped())  # calls already waiting were in flight

    async def exchange(self, call: Call[Any], deadline: float) -> Reply:
        self._catch_up()
        sock = await self._connect()
        request_id = next(self._ids)
        body = _core.encode(call, request_id)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        timed_out = False
        try:
            try:
                await sock.send(body, zmq.NOBLOCK)
            except zmq.Again:
                # No pipe to queue on: a refused handshake takes it away; its event follows.
                self.pending.pop(request_id, None)
                now = self._monitor_now
                if now is not None and now.poll(_link.HANDSHAKE_EVENT_MS, zmq.POLLIN):
                    self._catch_up()
                if self.link.handshake is not None:
                    self.drop()
                    raise _link.handshake_error(self.owner.endpoint, self.link) from None
                raise DaemonUnavailableError(
                    f"{call.op}: cannot queue the request for {self.owner.endpoint}",
                    endpoint=self.owner.endpoint,
                ) from None
            if self.link.unreachable(time.monotonic()):
                self.drop()
                raise _link.unreachable_error(self.owner.endpoint, self.link)
            if call.sending is not None:
                call.sending()  # while the daemon works on the request
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    return await future
            except TimeoutError:
                timed_out = True
                raise RequestTimeoutError(
                    f"{call.op}: no reply from {self.owner.endpoint} within the timeout",
                    endpoint=self.owner.endpoint,
                ) from None
        finally:
            self.pending.pop(request_id, None)
            # Replies are matched by id, so a late one is dropped; once nothing
            # else is in flight, start over on a fresh socket as the blocking
            # client does, so nothing queued for a stuck peer lingers.
            if timed_out and not self.pending and self._socket is sock:
                self.drop()
