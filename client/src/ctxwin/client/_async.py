"""The asyncio client: one DEALER socket, many requests in flight, replies matched by id.

Works on asyncio and on anyio's asyncio backend (pyzmq's asyncio support means
asyncio only).
"""

# The per-call ``timeout=`` of the twins is the wire call's deadline (it also decides
# when the socket is renewed), not a substitute for cancel scopes: keep ASYNC109 off.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, TypeVar

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from ctxwin import proto
from ctxwin.proto import Reply

from . import _auth, _autostart, _core, _link, _methods, _ops
from ._core import DEFAULT_TIMEOUT, Call, RetryPolicy
from ._errors import ClientClosedError, DaemonUnavailableError, RequestTimeoutError
from ._task import AsyncTask

T = TypeVar("T")


class AsyncClient:
    """asyncio client of ``ctxwind``: one coroutine method per wire op.

    Any number of calls may be in flight at once on its single socket; each
    reply finds its caller by request id. Use it as an async context manager,
    or await :meth:`aclose`. Bound to the event loop that first uses it.

    Args:
        endpoint: where the daemon listens; else ``$CTXWIN_ENDPOINT``, else
            the default endpoint.
        timeout: default seconds each call waits for its reply (busy retries
            included); every method also takes ``timeout=``.
        retry: how ``busy`` replies are retried.
        autostart: when nothing answers, start ``ctxwind`` on the endpoint and
            wait until it does (off by default).
        server_key: the daemon's public key to pin (40 Z85 characters, or its
            key file), else ``$CTXWIN_SERVER_KEY``: TCP connections then use
            CURVE and reach only a daemon holding that key's secret.
        client_key: this client's ``.key_secret`` file (``ctxwin keys client``),
            else ``$CTXWIN_CLIENT_KEY``, else ``client.key_secret`` in
            ``$CTXWIN_KEYS_DIR`` or ``~/.config/ctxwin/keys``; read only with a server key.
        trusted_endpoints: endpoints ``owned_elsewhere`` may send calls to
            without CURVE (else ``$CTXWIN_TRUSTED_ENDPOINTS``); besides these
            a referral is followed only to a TCP endpoint with a pinned server
            key or to this user's own ipc socket.
        context: the ZeroMQ asyncio context to use (the process-wide one by default).

    Each op method takes the op's arguments from the wire table (DESIGN.md),
    with ``deleted_range`` left out meaning "the task's stored range" and
    ``None`` clearing it, and ``ts`` defaulting to now; it returns the op's
    result map (a TypedDict from ``ctxwin.proto``). The ``close`` op is
    :meth:`close_task`, since ``close`` closes the client.

    Raises:
        CtxwinError: from every op method: the subclass for the daemon's error
            code (``BusyError`` once the retries are spent), or, before
            anything is sent, for arguments the daemon would refuse (``local``
            set); ``RequestTimeoutError`` when no reply comes in time;
            ``DaemonUnavailableError`` at once when nothing listens at the
            endpoint, or when the connection drops with a call in flight that
            is not safe to send again (``_link.SAFE_TO_REPEAT``; those are resent);
            ``AuthenticationError`` (one of them) when the CURVE handshake fails;
            ``OwnedElsewhereError`` for a referral that is not followed.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        autostart: bool = False,
        context: zmq.asyncio.Context | None = None,
        server_key: str | None = None,
        client_key: str | os.PathLike[str] | None = None,
        trusted_endpoints: Sequence[str] | None = None,
    ) -> None:
        self.endpoint = proto.resolve_endpoint(endpoint)
        self.curve = _auth.curve_keys(server_key, client_key)
        self.trusted_endpoints = _auth.trusted_endpoints(trusted_endpoints)
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.autostart = autostart
        self._context = context or zmq.asyncio.Context.instance()
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._monitor_now: zmq.Socket[bytes] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._link = _link.Link()
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._ids = itertools.count(1)
        self._connecting: asyncio.Lock | None = None
        self._closed = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the socket (linger 0) and fail calls still waiting; later calls raise."""
        self._closed = True
        tasks = self._drop_socket()
        if tasks and tasks[0].get_loop() is asyncio.get_running_loop():
            # Wait for the readers to end without taking a cancellation of our own caller.
            await asyncio.wait(tasks)

    def close(self) -> None:
        """Close the socket now, from any thread or loop (or none); later calls raise.

        Unlike :meth:`aclose` it does not wait for the socket's reader to end;
        for owners that close from a finalizer or from blocking code.
        """
        self._closed = True
        self._drop_socket()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` or :meth:`close` was called."""
        return self._closed

    def task(
        self,
        task_id: str,
        *,
        ephemeral: bool = False,
        delta: bool = True,
        dialect: str | None = None,
        read_tools: _ops.ReadTools | None = None,
    ) -> AsyncTask:
        """A handle bound to one task id.

        Args:
            task_id: the task.
            ephemeral: keep the task in the daemon's memory only (subagent runners).
            dialect: the task's message dialect (``openai-chat``, ``anthropic``,
                ``openai-responses``, ``gemini``; None: ``cline``), fixed at first use.
            read_tools: the task's own read tools besides the daemon's table
                (``{"name", "arg", "when"?, "pattern"?}`` maps; native dialects only).
            delta: sync the history by delta (send what each turn adds).
        """
        return AsyncTask(
            self,
            task_id,
            ephemeral=ephemeral,
            delta=delta,
            dialect=dialect,
            read_tools=read_tools,
        )

    # Transport.

    async def _move_to(self, endpoint: str, deadline: float) -> None:
        """Use ``endpoint`` from now on, once the calls in flight on this socket are answered."""
        waiting = [future for future in self._pending.values() if not future.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=max(0.0, deadline - time.monotonic()))
        if self.endpoint != endpoint:
            self._drop_socket()
            self.endpoint = endpoint

    def _drop_socket(self, reason: Exception | None = None) -> list[asyncio.Task[None]]:
        """Close the socket, stop its readers, fail the calls still waiting on it."""
        tasks = [task for task in (self._reader, self._watcher) if task is not None]
        self._reader = self._watcher = None
        if self._socket is not None:
            self._socket.disable_monitor()
            self._socket.close(linger=0)
            self._socket = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = self._monitor_now = None
        for task in tasks:
            if not task.get_loop().is_closed():
                task.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(reason or ClientClosedError("the client was closed"))
        self._pending.clear()
        return tasks

    async def _connect(self) -> zmq.asyncio.Socket:
        if self._closed:
            raise ClientClosedError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._reader is not None and self._reader.get_loop() is not loop:
            self._drop_socket()  # first used on another loop, now gone
            self._connecting = None
        if self._socket is not None:
            return self._socket
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._socket is None:
                if self.autostart:
                    await loop.run_in_executor(None, _autostart.ensure_daemon, self.endpoint)
                    if self._closed:
                        raise ClientClosedError("the client is closed")
                sock = self._context.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                curve = self.curve is not None and self.curve.apply(sock, self.endpoint)
                monitor = sock.get_monitor_socket(_link.MONITOR_EVENTS)
                try:
                    sock.connect(self.endpoint)
                except zmq.ZMQError as exc:
                    sock.disable_monitor()
                    monitor.close(linger=0)
                    sock.close(linger=0)
                    raise _link.connect_error(self.endpoint, exc) from None
                self._socket, self._monitor = sock, monitor
                self._monitor_now = zmq.Socket.shadow(monitor.underlying)
                self._link.fresh(curve)
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
                target = _core.reply_target(reply, self._pending.keys())
                future = self._pending.get(target) if target is not None else None
                if future is not None and not future.done():
                    future.set_result(reply)
        except zmq.ZMQError as exc:
            # The socket broke under us: fail the waiting calls, let the next one reconnect.
            if self._socket is sock:
                self._reader = None
                self._drop_socket(
                    DaemonUnavailableError(f"receiving failed: {exc}", endpoint=self.endpoint)
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
                self._link.feed(event["event"], now)
                if self._link.handshake is not None:  # refused: nothing was sent
                    self._watcher = None
                    self._drop_socket(_link.handshake_error(self.endpoint, self._link))
                elif self._link.dropped:
                    self._watcher = None
                    self._drop_socket(_link.Dropped())
                elif self._pending and self._link.unreachable(now):
                    self._watcher = None
                    self._drop_socket(_link.unreachable_error(self.endpoint, self._link))
        except zmq.ZMQError:
            pass  # the monitor was closed with its socket

    def _catch_up(self) -> None:
        """Take the monitor's events so far, now: a drop before a call is not that call's."""
        now = self._monitor_now  # the monitor, read without the event loop
        while now is not None and now.poll(0, zmq.POLLIN):
            self._link.feed(parse_monitor_message(now.recv_multipart())["event"], time.monotonic())
        if self._link.handshake is not None:
            self._drop_socket(_link.handshake_error(self.endpoint, self._link))
        elif self._link.dropped:
            self._drop_socket(_link.Dropped())  # calls already waiting were in flight

    async def _exchange(self, call: Call[Any], deadline: float) -> Reply:
        self._catch_up()
        sock = await self._connect()
        request_id = next(self._ids)
        body = _core.encode(call, request_id)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        timed_out = False
        try:
            try:
                await sock.send(body, zmq.NOBLOCK)
            except zmq.Again:
                # No pipe to queue on: a refused handshake takes it away; its event follows.
                self._pending.pop(request_id, None)
                now = self._monitor_now
                if now is not None and now.poll(_link.HANDSHAKE_EVENT_MS, zmq.POLLIN):
                    self._catch_up()
                if self._link.handshake is not None:
                    self._drop_socket()
                    raise _link.handshake_error(self.endpoint, self._link) from None
                raise DaemonUnavailableError(
                    f"{call.op}: cannot queue the request for {self.endpoint}",
                    endpoint=self.endpoint,
                ) from None
            if self._link.unreachable(time.monotonic()):
                self._drop_socket()
                raise _link.unreachable_error(self.endpoint, self._link)
            if call.sending is not None:
                call.sending()  # while the daemon works on the request
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    return await future
            except TimeoutError:
                timed_out = True
                raise RequestTimeoutError(
                    f"{call.op}: no reply from {self.endpoint} within the timeout",
                    endpoint=self.endpoint,
                ) from None
        finally:
            self._pending.pop(request_id, None)
            # Replies are matched by id, so a late one is dropped; once nothing
            # else is in flight, start over on a fresh socket as the blocking
            # client does, so nothing queued for a stuck peer lingers.
            if timed_out and not self._pending and self._socket is sock:
                self._drop_socket()

    async def call(self, call: Call[T], *, timeout: float | None = None) -> T:
        """Send a built request and return its typed result.

        Args:
            call: from one of the builders in ``ctxwin.client._ops``.
            timeout: seconds for the whole call, busy retries included (the
                call's own timeout, else the client's, when None).

        Raises:
            CtxwinError: the subclass for the error (see ``ctxwin.client``).
        """
        deadline = time.monotonic() + _core.call_budget(call, timeout, self.timeout)
        attempt = 0
        followed = False
        while True:
            try:
                reply = await self._exchange(call, deadline)
            except _link.Dropped:
                _link.after_drop(call, self.endpoint)
                continue
            remaining = deadline - time.monotonic()
            step = _core.outcome(call, reply, attempt, self.retry, remaining, followed)
            if isinstance(step, _core.Follow):
                # The task's owner is another daemon: move this client to it.
                _auth.check_referral(step.owner, self.curve, self.trusted_endpoints)
                followed = True
                await self._move_to(step.owner, deadline)
                continue
            if not isinstance(step, _core.Retry):
                return step
            await asyncio.sleep(step.delay)
            attempt += 1

    async def _features(self, deadline: float) -> frozenset[str]:
        """What the daemon on this connection supports: ping's ``features``, asked
        once per connection (and again on the next one) within ``deadline``."""
        features = self._link.features if self._socket is not None else None
        if features is None:
            pong = await self.call(_ops.ping(), timeout=_core.left(deadline))
            features = self._link.features = _link.features_of(pong)
        return features

    # One method per wire op (DESIGN.md table), each taking exactly its builder's arguments.

    ping = _methods.awaiting(_ops.ping)
    stats = _methods.awaiting(_ops.stats)
    context_window_info = _methods.awaiting(_ops.context_window_info)
    should_compact = _methods.awaiting(_ops.should_compact)
    next_truncation_range = _methods.awaiting(_ops.next_truncation_range)
    prepare_request = _methods.awaiting(_ops.prepare_request)
    plan = _methods.awaiting(_ops.plan)
    truncated_messages = _methods.awaiting(_ops.truncated_messages)
    optimize_file_reads = _methods.awaiting(_ops.optimize_file_reads)
    optimize_file_reads_in_memory = _methods.awaiting(_ops.optimize_file_reads_in_memory)
    compact_subagent = _methods.awaiting(_ops.compact_subagent)
    apply_truncation_notice = _methods.awaiting(_ops.apply_truncation_notice)
    compact = _methods.awaiting(_ops.compact)
    condense = _methods.awaiting(_ops.condense)
    condensed = _methods.awaiting(_ops.condensed)
    rollback = _methods.awaiting(_ops.rollback)
    inspect = _methods.awaiting(_ops.inspect)
    flush = _methods.awaiting(_ops.flush)
    close_task = _methods.awaiting(_ops.close)
    count_tokens = _methods.awaiting(_ops.count_tokens)
