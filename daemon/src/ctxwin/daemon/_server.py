"""Requests: routes, replies and the daemon's statistics.

The socket (``_socket.py``) hands each request's envelope and body to
:meth:`Server.take`; task-free ops are answered inline, without a hop; task
ops go to the task's actor (``busy`` when its mailbox is full). A large body
is decoded in slices (``_decode.py``) so that others are answered meanwhile.

Results the table in DESIGN.md leaves open: ``flush`` answers
``{"flushed": n}``, the number of tasks written by this call (0 when all were
durable already; ephemeral tasks never count), and for one task also
``loaded``: whether the daemon had it loaded (false: nothing to write); ``close``
answers ``{"closed": true, "loaded": true}`` when it stopped the task's actor,
and ``{"closed": false, "loaded": false}`` for a task that was not loaded (never
opened, or closed or unloaded already): nothing to close; ``stats.tasks``
counts the distinct task ids served since start, ``stats.actors`` the actors
running now, ``stats.clients`` what each client holds (by the name the ZAP
handler gave its connection: ``key:NAME``, ``uid:N``, ``tcp:ADDRESS``): its
``tasks``, its ``requests`` in flight and its kept ``history_bytes``.
Requests queued behind a ``close`` of the same task, or on an actor that
stops, are answered ``busy`` (send again).

Each client has at most ``max_client_requests`` requests in flight (sent to
an actor or a worker thread, or a large body being decoded); past it its
requests are answered ``busy`` and the others' are not held up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.to_thread
import structlog
import zmq

from ctxwin import proto

from ._actors import ActorSystem
from ._auth import binding_of
from ._config import Config
from ._decode import SLICED_DECODE_BYTES, TooManyMessages, decode_in_slices, decode_now
from ._errors import ActorStoppedError, BusyError
from ._ops import route_problems, run_free_op
from ._schedule import FlushError
from ._session import _OWN_OPS
from ._socket import RouterSocket, client_of
from ._tokens import TokenCounter
from .store import Spawn

__all__ = ["Server"]

_log = structlog.get_logger("ctxwin.daemon.server")

_SHUTDOWN_GRACE_S = 30.0
_DECODE_WHOLE_BYTES = 64 * 1024
"""Bodies up to this size are decoded by msgpack in one call (at most 65,536 values);
larger ones within the limits of ``_decode.py``."""
# The codec's hot-path twins (one Packer for the event loop's thread).
_decode_request = proto.decode_request_parts
_encode_result = proto.result_encoder()


def _error_reply(exc: BaseException, request_id: int | None, op: str) -> bytes:
    """Encode the error reply for an exception raised while handling a request."""
    if isinstance(exc, proto.ProtocolError):
        return proto.encode_error(
            request_id if exc.request_id is None else exc.request_id,
            exc.code,
            exc.message,
            exc.owner,
        )
    if isinstance(exc, BusyError | ActorStoppedError):
        return proto.encode_error(request_id, proto.ErrorCode.BUSY, str(exc))
    if isinstance(exc, FlushError):
        return proto.encode_error(request_id, proto.ErrorCode.INTERNAL, str(exc))
    return proto.encode_error(
        request_id, proto.ErrorCode.INTERNAL, f"internal error in {op}: {type(exc).__name__}"
    )


def _log_failure(exc: BaseException, request_id: int | None, op: str, task: str | None) -> None:
    """Log a failed request (no conversation text)."""
    if isinstance(exc, proto.ProtocolError | BusyError | ActorStoppedError):
        _log.info(
            "request_refused",
            op=op,
            id=request_id,
            task=task,
            code=_code_of(exc),
            reason=str(exc),
        )
    elif isinstance(exc, FlushError):
        _log.error("request_failed", op=op, id=request_id, task=task, reason=str(exc))
    else:
        _log.error(
            "request_failed",
            op=op,
            id=request_id,
            task=task,
            error_type=type(exc).__name__,
            exc_info=exc,
        )


def _check_binding(
    bindings: Mapping[str, tuple[str, ...]], client: str, op: str, task: object
) -> None:
    """Refuse a bound client's request for a task outside its prefixes (``forbidden``).

    Only clients with a key (``key:NAME``) are bound; with bindings configured
    a key that has none (and no ``default``) is refused every request.
    """
    if not client.startswith("key:"):
        return  # ipc: the daemon's own user (or group)
    user = client[4:]
    prefixes = binding_of(bindings, user)
    if prefixes is None:
        raise proto.ProtocolError(
            proto.ErrorCode.FORBIDDEN,
            f"client {user!r} is bound to no task: [client_tasks] binds other keys, and "
            f'neither {user!r} nor default (default = "*" lets unbound keys use every task)',
        )
    if "" in prefixes or not isinstance(task, str | None):
        return  # every task, or not a task id: the args check refuses it
    if task is None:
        if op == "flush":
            raise proto.ProtocolError(
                proto.ErrorCode.FORBIDDEN,
                f"client {user!r} may use only tasks starting with "
                f"{', '.join(map(repr, prefixes))}: flush without a task writes every task",
            )
        return
    if not task.startswith(prefixes):
        raise proto.ProtocolError(
            proto.ErrorCode.FORBIDDEN,
            f"client {user!r} may use only tasks starting with "
            f"{', '.join(map(repr, prefixes))}, not {task!r}",
        )


class _WireReply:
    """Sends a request's outcome back through the socket, with its envelope."""

    __slots__ = ("client", "envelope", "op", "request_id", "server", "task")

    def __init__(
        self, server: Server, envelope: list[bytes], request_id: int, op: str, task: str | None
    ) -> None:
        self.server = server
        self.envelope = envelope
        self.request_id = request_id
        self.op = op
        self.task = task
        self.client = server.take_slot()

    def set_result(self, result: dict[str, Any]) -> None:
        try:
            body = _encode_result(self.request_id, result)
        except Exception as exc:
            self.set_exception(exc)
            return
        self.server.reply_done(self.client)
        self.server.send(self.envelope, body)

    def set_exception(self, exc: BaseException) -> None:
        self.server.reply_done(self.client)
        _log_failure(exc, self.request_id, self.op, self.task)
        self.server.send(self.envelope, _error_reply(exc, self.request_id, self.op))


class Server:
    """The dispatch of requests to routes, and the daemon's statistics.

    Args:
        config: the daemon's configuration.
        system: the task actors.
        tokens: the token counter for ``count_tokens``.
        spawn: starts a coroutine function in the daemon's task group.

    Raises:
        StartupError: the server keys cannot be loaded.
    """

    def __init__(
        self, config: Config, system: ActorSystem, tokens: TokenCounter, spawn: Spawn
    ) -> None:
        self.config = config
        self.limits = config.limits
        self.tokens = tokens
        self.system = system
        self.spawn = spawn
        self.counters = system.counters
        self.started = time.monotonic()
        self.in_flight = 0
        self.max_client_requests = config.max_client_requests
        self.requests_of: dict[str, int] = {}  # client -> requests in flight
        # The request being dispatched: its last frame, or its client's name once known.
        self._peer: zmq.Frame | str | None = None
        self._quiet = asyncio.Event()
        self._ping_result: dict[str, Any] = {
            "pong": True,
            "version": proto.__version__,
            "proto": proto.PROTOCOL_VERSION,
            "features": [*proto.FEATURES, *system.store.features],
            "dialects": list(proto.DIALECTS),
        }
        self._routes = self._build_routes()
        self._check_limiter = anyio.CapacityLimiter(2)  # large requests checked at once
        self.socket = RouterSocket(config, self.take)
        self.bindings = self.socket.bindings
        self.send = self.socket.send  # replies go straight to the socket (no hop)

    def bind(self) -> int:
        """Bind the socket's endpoints (see :meth:`RouterSocket.bind`); returns the gated count."""
        return self.socket.bind()

    def start_reading(self) -> None:
        """Start taking requests."""
        self.socket.start_reading()

    def close(self) -> None:
        """Close the socket, giving queued replies a moment to leave."""
        self.socket.close()

    def take_slot(self) -> str:
        """Count a request of the client being dispatched as in flight; that client's name.

        Raises:
            BusyError: the client has ``max_client_requests`` in flight already.
        """
        client = _name_of(self._peer)
        held = self.requests_of.get(client, 0)
        if held >= self.max_client_requests:
            raise BusyError(
                f"this client ({client}) has {held} requests in flight, its limit "
                "(max_client_requests); wait for their replies"
            )
        self.requests_of[client] = held + 1
        self.in_flight += 1
        return client

    def reply_done(self, client: str | None = None) -> None:
        """Note that one request waiting for a reply got it (``client``'s, if counted)."""
        if client is not None:
            left = self.requests_of.get(client, 1) - 1
            if left > 0:
                self.requests_of[client] = left
            else:
                self.requests_of.pop(client, None)
        self.in_flight -= 1
        if self.in_flight <= 0:
            self._quiet.set()

    # -- requests -------------------------------------------------------------------

    def take(self, envelope: list[bytes], body: bytes, peer: zmq.Frame) -> None:
        """One request from the socket: decoded and routed (the reply is sent now or later)."""
        if len(body) > SLICED_DECODE_BYTES:
            self._peer = peer
            try:
                client = self.take_slot()  # the shutdown waits for its reply
            except BusyError as exc:
                peeked = proto.peek_request_id(body)
                _log_failure(exc, peeked, "?", None)
                self.send(envelope, _error_reply(exc, peeked, "?"))
                return
            finally:
                self._peer = None
            # The name, not the frame: the frame holds a copy of the body.
            self.spawn(lambda: self._handle_large(envelope, body, client))
            return
        request_id: int | None = None
        op = "?"
        try:
            if len(body) > _DECODE_WHOLE_BYTES:  # within the limits, in order with the others
                request_id, op, args = decode_now(
                    body,
                    self.limits,
                    self.config.max_messages,
                    self._binding_check(client_of(peer)),
                )
            else:
                request_id, op, args = _decode_request(body, self.limits)
        except TooManyMessages as exc:
            self._refuse_too_many(envelope, body, exc)
            return
        except Exception as exc:
            _log_failure(exc, request_id, op, None)
            self.send(envelope, _error_reply(exc, request_id, op))
            return
        self._dispatch(envelope, request_id, op, args, peer)

    def _refuse_too_many(self, envelope: list[bytes], body: bytes, exc: TooManyMessages) -> None:
        """Answer ``too_large`` for a request of more than ``max_messages`` messages."""
        peeked = proto.peek_request_id(body)
        error = proto.ProtocolError(
            proto.ErrorCode.TOO_LARGE, self._too_many(exc.field, exc.count), peeked
        )
        _log_failure(error, peeked, "?", None)
        self.send(envelope, _error_reply(error, peeked, "?"))

    async def _handle_large(self, envelope: list[bytes], body: bytes, client: str) -> None:
        """A large request: decoded in slices (``_decode.py``) so others are answered meanwhile.

        Requests that arrive while it is decoded may be answered before it. It
        holds one of its client's in-flight slots while it is decoded.
        """
        handed = False
        try:
            try:
                request_id, op, args = await decode_in_slices(
                    body,
                    self.limits,
                    self.config.max_messages,
                    self._binding_check(client),
                )
            except TooManyMessages as exc:
                self._refuse_too_many(envelope, body, exc)
                return
            except Exception as exc:
                _log_failure(exc, None, "?", None)
                self.send(envelope, _error_reply(exc, None, "?"))
                return
            try:
                # Checking 100,000 messages takes the loop for hundreds of ms: a worker
                # thread runs Python code in turns with it (every 5 ms at most).
                await anyio.to_thread.run_sync(
                    proto.validate_args, op, args, limiter=self._check_limiter
                )
            except Exception as exc:
                _log_failure(exc, request_id, op, args.get("task"))
                self.send(envelope, _error_reply(exc, request_id, op))
                return
            # The decode's slot passes to the request's reply, which takes one of its own:
            # a large request holds one slot of its client, not two.
            handed = True
            self.reply_done(client)
            self._dispatch(envelope, request_id, op, args, client, validated=True)
        finally:
            if not handed:
                self.reply_done(client)

    def _binding_check(self, client: str) -> Callable[[int, str, object], None] | None:
        """A bound client's prefix check, for the decoder to make before it reads the body."""
        if not self.bindings:
            return None
        bindings = self.bindings

        def check(request_id: int, op: str, task: object) -> None:
            try:
                _check_binding(bindings, client, op, task)
            except proto.ProtocolError as exc:
                exc.request_id = request_id
                raise

        return check

    def _dispatch(
        self,
        envelope: list[bytes],
        request_id: int,
        op: str,
        args: dict[str, Any],
        peer: zmq.Frame | str,
        *,
        validated: bool = False,
    ) -> None:
        """Check a decoded request and route it (the reply is sent now or by its actor).

        ``peer``: the request's last frame, or its client's name. ``validated``: the
        args were checked already (a large request, in a worker thread).
        """
        task: str | None = None
        self._peer = peer  # the routes name the client from it
        try:
            if self.bindings:  # before the args say anything
                _check_binding(self.bindings, _name_of(peer), op, args.get("task"))
            if not validated:
                proto.validate_args(op, args)
            self._check_message_count(op, args)
            task = args.get("task")
            result = self._routes[op](envelope, request_id, op, args, task)
            if result is not None:
                self.send(envelope, _encode_result(request_id, result))
        except Exception as exc:
            _log_failure(exc, request_id, op, task)
            self.send(envelope, _error_reply(exc, request_id, op))
        finally:
            self._peer = None

    def _check_message_count(self, op: str, args: dict[str, Any]) -> None:
        """Refuse a request of more than ``max_messages`` messages (``too_large``)."""
        count = len(args.get("messages") or ()) + len(args.get("append") or ())
        if count > self.config.max_messages:
            raise proto.ProtocolError(proto.ErrorCode.TOO_LARGE, self._too_many(op, count))

    def _too_many(self, where: str, count: int) -> str:
        return (
            f"{where}: {count} messages in one request; at most {self.config.max_messages} "
            "(max_messages): send the history of a task this long as a delta (base, append)"
        )

    # -- dispatch: one route per op ------------------------------------------------
    #
    # A route answers at once (returns the result map) or later through a
    # _WireReply (returns None); it raises for a refusal.

    def _build_routes(self) -> dict[str, _Route]:
        """A route for every op ``proto.OPS`` declares (refused at start when one has none)."""
        problems = route_problems(SERVER_OPS, _OWN_OPS)
        if problems:
            raise RuntimeError("the op tables disagree with proto.OPS: " + "; ".join(problems))
        own: dict[str, _Route] = {op: getattr(self, f"_{op}") for op in SERVER_OPS}
        return {
            op: own.get(op) or (self._to_actor if spec.needs_task else self._free)
            for op, spec in proto.OPS.items()
        }

    def _ping(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        return self._ping_result

    def _stats(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        return dict(self.statistics())

    def _free(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        return run_free_op(op, args, self.tokens)

    def _to_actor(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        reply = _WireReply(self, envelope, request_id, op, task)
        try:
            actor = self.system.actor_for(task, bool(args.get("ephemeral", False)), reply.client)
            actor.tell(op, args, reply)
        except Exception:
            self.reply_done(reply.client)
            raise
        return None

    def _close(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        self.system.close(task, args, _WireReply(self, envelope, request_id, op, task))
        return None

    def _should_compact(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        if "task" in args:
            return self._to_actor(envelope, request_id, op, args, task)
        return self._free(envelope, request_id, op, args, task)

    def _count_tokens(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        """Count in a worker thread: a cold 1 MB count takes 50-100 ms of the event loop."""
        reply = _WireReply(self, envelope, request_id, op, None)

        async def count() -> None:
            try:
                result = await anyio.to_thread.run_sync(run_free_op, op, args, self.tokens)
            except Exception as exc:
                reply.set_exception(exc)
            else:
                reply.set_result(result)

        self.spawn(count)
        return None

    def _flush(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        self.system.flush(task, _WireReply(self, envelope, request_id, op, task))
        return None

    def statistics(self) -> proto.StatsResult:
        """The daemon's counts now: the ``stats`` result."""
        counts = self.system.statistics()
        return proto.StatsResult(
            tasks=counts["tasks"],
            actors=counts["actors"],
            requests=self.socket.received,
            flushes=self.counters.flushes,
            write_failures=self.counters.write_failures,
            uptime_s=round(time.monotonic() - self.started, 3),
            histories=counts["histories"],
            history_bytes=counts["history_bytes"],
            calibrated_tasks=counts["calibrated_tasks"],
            calibration_median=counts["calibration_median"],
            store=self.system.store.describe(),
            cache=counts["cache"],
            clients=self._clients(),
        )

    def _clients(self) -> dict[str, dict[str, int]]:
        """By client: the tasks and kept history it holds, and its requests in flight."""
        clients = self.system.clients()
        for client in self.requests_of:
            clients.setdefault(client, {"tasks": 0, "history_bytes": 0})
        for client, held in clients.items():
            held["requests"] = self.requests_of.get(client, 0)
        return dict(sorted(clients.items()))

    async def shutdown(self) -> bool:
        """Stop accepting, finish what is queued, flush every task (the store stays open).

        Returns:
            Whether every task's state is durable.
        """
        self.socket.stop_reading()
        await self.system.stop_all(_SHUTDOWN_GRACE_S)
        with anyio.move_on_after(_SHUTDOWN_GRACE_S):
            while self.in_flight > 0:
                self._quiet.clear()
                await self._quiet.wait()
        return self.system.final_flush_failures == 0 and not self.system.actors


SERVER_OPS = ("ping", "stats", "flush", "close", "count_tokens", "should_compact")
"""The ops the server answers itself (each by its method ``_<op>``); it sends every other
task op to the task's actor and answers every other task-free one from ``_ops``."""

_Route = Callable[[list[bytes], int, str, dict[str, Any], Any], dict[str, Any] | None]


def _name_of(peer: zmq.Frame | str | None) -> str:
    """A request's client name: from its last frame (see ``client_of``), or as given."""
    if peer is None:
        return "?"
    return peer if isinstance(peer, str) else client_of(peer)


def _code_of(exc: BaseException) -> str:
    if isinstance(exc, proto.ProtocolError):
        return exc.code.value
    return proto.ErrorCode.BUSY.value
