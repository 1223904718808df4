"""The asyncio client: one DEALER socket, many requests in flight, replies matched by id.

Works on asyncio and on anyio's asyncio backend (pyzmq's asyncio support means
asyncio only). The blocking client, ``_sync.py``, is generated from this file:
edit this one, then run ``python3 client/scripts/generate.py`` (a test fails
while the generated twin is stale). What differs between the twins and is not
a name lives in their sockets (``_async_socket.py``, ``_sync_socket.py``).
"""

# The per-call ``timeout=`` of the twins is the wire call's deadline (it also decides
# when the socket is renewed), not a substitute for cancel scopes: keep ASYNC109 off.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import TypeVar

import zmq
import zmq.asyncio

from ctxwin import proto

from . import _auth, _core, _link, _methods, _ops
from ._async_socket import AsyncSocket
from ._async_task import AsyncTask
from ._closing import AsyncClosing
from ._core import DEFAULT_TIMEOUT, Call, RetryPolicy, left

T = TypeVar("T")


class AsyncClient(AsyncClosing):
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
        self._wire = AsyncSocket(self, context or zmq.asyncio.Context.instance())

    async def aclose(self) -> None:
        """Close the socket (linger 0) and fail calls still waiting; later calls raise."""
        await self._wire.aclose()

    # unasync: async only
    def close(self) -> None:
        """Close the socket now, from any thread or loop (or none); later calls raise.

        Unlike :meth:`aclose` it does not wait for the socket's reader to end;
        for owners that close from a finalizer or from blocking code.
        """
        self._wire.close()

    # unasync: end
    @property
    def closed(self) -> bool:
        """Whether the client was closed."""
        return self._wire.closed

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

    async def call(self, call: Call[T], *, timeout: float | None = None) -> T:
        """Send a built request and return its typed result.

        Args:
            call: from one of the builders in ``ctxwin.client._ops``.
            timeout: seconds for the whole call, busy retries included (the
                call's own timeout, else the client's, when None).

        Raises:
            CtxwinError: the subclass for the error (see ``ctxwin.client``).
        """
        budget = _core.call_budget(call, timeout, self.timeout)
        deadline = time.monotonic() + budget
        async with self._wire.turn(call.op, budget):
            attempt = 0
            followed = False
            while True:
                try:
                    reply = await self._wire.exchange(call, deadline)
                except _link.Dropped:
                    _link.after_drop(call, self.endpoint)
                    continue
                remaining = deadline - time.monotonic()
                step = _core.outcome(call, reply, attempt, self.retry, remaining, followed)
                if isinstance(step, _core.Follow):
                    # The task's owner is another daemon: move this client to it.
                    _auth.check_referral(step.owner, self.curve, self.trusted_endpoints)
                    followed = True
                    await self._wire.move_to(step.owner, deadline)
                    continue
                if not isinstance(step, _core.Retry):
                    return step
                await asyncio.sleep(step.delay)
                attempt += 1

    async def _features(self, deadline: float) -> frozenset[str]:
        """What the daemon on this connection supports, asked once per connection."""
        link = self._wire.link
        if not self._wire.connected or link.features is None:
            link.features = _link.features_of(await self.call(_ops.ping(), timeout=left(deadline)))
        return link.features

    # One method per wire op (DESIGN.md table), each taking exactly its builder's arguments.
    # -- the op methods: generated by client/scripts/generate.py from proto.OPS --
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
    condensed = _methods.awaiting(_ops.condensed)
    condense = _methods.awaiting(_ops.condense)
    rollback = _methods.awaiting(_ops.rollback)
    inspect = _methods.awaiting(_ops.inspect)
    flush = _methods.awaiting(_ops.flush)
    close_task = _methods.awaiting(_ops.close)
    count_tokens = _methods.awaiting(_ops.count_tokens)
    # -- end of the generated op methods --
