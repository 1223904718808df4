"""The blocking client: one DEALER socket, one request at a time."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, TypeVar

import zmq

from ctxwin import proto

from . import _auth, _core, _link, _methods, _ops
from ._core import DEFAULT_TIMEOUT, Call, RetryPolicy, left
from ._sync_socket import BlockingSocket
from ._task import Task
from ._turns import Turns

T = TypeVar("T")


class Client:
    """Blocking client of ``ctxwind``: one method per wire op.

    Safe to share between threads (calls are serialised). Use it as a context
    manager, or call :meth:`close`.

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
        context: the ZeroMQ context to use (the process-wide one by default).

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
        context: zmq.Context[Any] | None = None,
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
        self._wire = BlockingSocket(self, context or zmq.Context.instance())
        self._turns = Turns()
        self._closed = False

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket (linger 0); later calls raise ClientClosedError."""
        with self._turns.take(None, RuntimeError):  # after the call in flight, if any
            self._closed = True
            self._wire.drop()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def task(
        self,
        task_id: str,
        *,
        ephemeral: bool = False,
        delta: bool = True,
        dialect: str | None = None,
        read_tools: _ops.ReadTools | None = None,
    ) -> Task:
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
        return Task(
            self,
            task_id,
            ephemeral=ephemeral,
            delta=delta,
            dialect=dialect,
            read_tools=read_tools,
        )

    def call(self, call: Call[T], *, timeout: float | None = None) -> T:
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
        too_long = functools.partial(_core.queued_too_long, call.op, self.endpoint, "client")
        with self._turns.take(_core.lock_wait(budget), too_long):
            attempt = 0
            followed = False
            while True:
                try:
                    reply = self._wire.exchange(call, deadline)
                except _link.Dropped:
                    _link.after_drop(call, self.endpoint)
                    continue
                remaining = deadline - time.monotonic()
                step = _core.outcome(call, reply, attempt, self.retry, remaining, followed)
                if isinstance(step, _core.Follow):
                    # The task's owner is another daemon: move this client to it.
                    _auth.check_referral(step.owner, self.curve, self.trusted_endpoints)
                    followed = True
                    self._wire.move_to(step.owner)
                    continue
                if not isinstance(step, _core.Retry):
                    return step
                time.sleep(step.delay)
                attempt += 1

    def _features(self, deadline: float) -> frozenset[str]:
        """What the daemon on this connection supports, asked once per connection."""
        link = self._wire.link
        if not self._wire.connected or link.features is None:
            link.features = _link.features_of(self.call(_ops.ping(), timeout=left(deadline)))
        return link.features

    # One method per wire op (DESIGN.md table), each taking exactly its builder's arguments.
    # -- the op methods: generated by client/scripts/generate.py from proto.OPS --
    ping = _methods.blocking(_ops.ping)
    stats = _methods.blocking(_ops.stats)
    context_window_info = _methods.blocking(_ops.context_window_info)
    should_compact = _methods.blocking(_ops.should_compact)
    next_truncation_range = _methods.blocking(_ops.next_truncation_range)
    prepare_request = _methods.blocking(_ops.prepare_request)
    plan = _methods.blocking(_ops.plan)
    truncated_messages = _methods.blocking(_ops.truncated_messages)
    optimize_file_reads = _methods.blocking(_ops.optimize_file_reads)
    optimize_file_reads_in_memory = _methods.blocking(_ops.optimize_file_reads_in_memory)
    compact_subagent = _methods.blocking(_ops.compact_subagent)
    apply_truncation_notice = _methods.blocking(_ops.apply_truncation_notice)
    compact = _methods.blocking(_ops.compact)
    condensed = _methods.blocking(_ops.condensed)
    condense = _methods.blocking(_ops.condense)
    rollback = _methods.blocking(_ops.rollback)
    inspect = _methods.blocking(_ops.inspect)
    flush = _methods.blocking(_ops.flush)
    close_task = _methods.blocking(_ops.close)
    count_tokens = _methods.blocking(_ops.count_tokens)
    # -- end of the generated op methods --
