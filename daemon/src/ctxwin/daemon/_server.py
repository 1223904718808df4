"""The ROUTER socket: receiving, request envelopes, dispatch, replies.

The socket is a plain (blocking-API) pyzmq socket whose FD the event loop
watches with ``add_reader``; on wake-up it is drained with ``NOBLOCK`` until
``EAGAIN``. Measured here: ``zmq.asyncio`` costs about 2x a raw blocking
REQ/REP echo, this about 1.3x. The ZeroMQ FD is edge-triggered and any socket
call may consume its edge, so every send made outside the drain loop is
followed by a look at ``EVENTS``.

Task-free ops are answered inline, without a hop; task ops go to the task's
actor (``busy`` when its mailbox is full).

Connections are accepted one at a time and only while descriptors are left
under the open-files limit (:class:`._accept.AcceptGate`): libzmq aborts the process
when an ipc ``accept()`` fails with EMFILE.

Results the table in DESIGN.md leaves open: ``flush`` answers
``{"flushed": n}``, the number of tasks written by this call (0 when all were
durable already; ephemeral tasks never count), and for one task also
``loaded``: whether the daemon had it loaded (false: nothing to write); ``close``
answers ``{"closed": true, "loaded": true}`` when it stopped the task's actor,
and ``{"closed": false, "loaded": false}`` for a task that was not loaded (never
opened, or closed or unloaded already): nothing to close; ``stats.tasks``
counts the distinct task ids served since start, ``stats.actors`` the actors
running now. Requests queued behind a ``close`` of the same task, or on an
actor that stops, are answered ``busy`` (send again).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast

import anyio
import anyio.abc
import anyio.to_thread
import structlog
import zmq

from ctxwin import engine, proto

from ._accept import FD_RESERVE, MIN_CLIENTS, AcceptGate, soft_open_files_limit
from ._actors import ActorStoppedError, ActorSystem, BusyError, Counters
from ._auth import Authenticator, KeysError, ServerKeys, load_server_keys
from ._config import Config
from ._decode import SLICED_DECODE_BYTES, TooManyMessages, decode_in_slices
from ._fleet import RedisStateStore
from ._ops import run_free_op
from ._redis import RedisStore, redis_available
from ._schedule import FlushError
from ._store import FileStore, StateStore
from ._tokens import TokenCounter

__all__ = ["DaemonStatistics", "Server", "StartupError"]

_log = structlog.get_logger("ctxwin.daemon.server")

# Messages handled per wake-up before yielding to actors and timers.
_DRAIN_BUDGET = 256
_EVENTS_CHECKS = 4
# Replies made while draining leave in batches of at most this many (see Server.send).
_SEND_BATCH = 32

# The hot path calls the backend socket methods with plain int flags: the
# high-level wrappers turn flags and EVENTS into enums, which costs more than
# the call itself (measured: send 0.7 us -> 0.24 us, EVENTS 2.1 us -> 1.8 us).
_recv = zmq.backend.Socket.recv
_send = zmq.backend.Socket.send
_get = cast(Callable[[zmq.Socket[bytes], int], int], zmq.backend.Socket.get)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_SHUTDOWN_GRACE_S = 30.0
# The codec's hot-path twins (one Packer for the event loop's thread).
_decode_request = proto.decode_request_parts
_encode_result = proto.result_encoder()
_PING_RESULT: dict[str, Any] = {
    "pong": True,
    "version": proto.__version__,
    "proto": proto.PROTOCOL_VERSION,
    "features": list(proto.FEATURES),
    "dialects": list(proto.DIALECTS),
}
_CLOSE_LINGER_MS = 2000


class StartupError(RuntimeError):
    """The daemon cannot start; the message says why (exit status 1)."""


@dataclass(frozen=True)
class DaemonStatistics:
    """The ``stats`` result.

    Attributes:
        tasks: distinct task ids served since start.
        actors: task actors running now.
        requests: requests received since start.
        flushes: task writes that reached the disk.
        write_failures: task writes that failed.
        uptime_s: seconds since start.
        histories: task histories kept for delta sync.
        history_bytes: their estimated resident size (the cap is ``--history-cache-mb``).
        calibrated_tasks: running tasks whose estimates have been calibrated.
        calibration_median: the median of their ratios (reported/estimated).
        store: the state store: ``kind`` (file or redis) and what it shows of itself.
        cache: the cache ledgers of the running tasks that have one, summed
            (docs/PRICING.md): ``tasks``, ``requests``, ``cached_tokens``,
            ``written_tokens``, ``cost``, ``keep_all_cost``.
    """

    tasks: int
    actors: int
    requests: int
    flushes: int
    write_failures: int
    uptime_s: float
    histories: int = 0
    history_bytes: int = 0
    calibrated_tasks: int = 0
    calibration_median: float | None = None
    store: dict[str, Any] | None = None
    cache: dict[str, Any] | None = None

    def wire(self) -> dict[str, Any]:
        """The wire result map."""
        return {
            "tasks": self.tasks,
            "actors": self.actors,
            "requests": self.requests,
            "flushes": self.flushes,
            "write_failures": self.write_failures,
            "uptime_s": self.uptime_s,
            "histories": self.histories,
            "history_bytes": self.history_bytes,
            "calibrated_tasks": self.calibrated_tasks,
            "calibration_median": self.calibration_median,
            "store": self.store,
            "cache": self.cache,
        }


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


class _WireReply:
    """Sends a request's outcome back through the socket, with its envelope."""

    __slots__ = ("envelope", "op", "request_id", "server", "task")

    def __init__(
        self, server: Server, envelope: list[bytes], request_id: int, op: str, task: str | None
    ) -> None:
        self.server = server
        self.envelope = envelope
        self.request_id = request_id
        self.op = op
        self.task = task
        server.in_flight += 1

    def set_result(self, result: dict[str, Any]) -> None:
        try:
            body = _encode_result(self.request_id, result)
        except Exception as exc:
            self.set_exception(exc)
            return
        self.server.reply_done()
        self.server.send(self.envelope, body)

    def set_exception(self, exc: BaseException) -> None:
        self.server.reply_done()
        self.server.log_failure(exc, self.request_id, self.op, self.task)
        self.server.send(self.envelope, _error_reply(exc, self.request_id, self.op))


class Server:
    """The ROUTER socket and the dispatch of requests.

    Args:
        config: the daemon's configuration.
        notices: notice texts for task states.
        tokens: the token counter for ``count_tokens``.

    Set :attr:`task_group` (where actors and background jobs run) before
    :meth:`start_reading`.
    """

    def __init__(self, config: Config, notices: engine.Notices, tokens: TokenCounter) -> None:
        self.keys: ServerKeys | None = None
        self.authenticator: Authenticator | None = None
        if config.keys_dir is not None and any(e.startswith("tcp://") for e in config.endpoints):
            try:
                self.keys = load_server_keys(config.keys_dir)
            except KeysError as exc:
                raise StartupError(str(exc)) from None
        # Client name -> task-id prefixes; the name comes with each message (User-Id).
        self.bindings = dict(config.client_tasks) if self.keys is not None else {}
        self.config = config
        self.limits = config.limits
        self.tokens = tokens
        self.task_group: anyio.abc.TaskGroup | None = None
        self.loop = asyncio.get_running_loop()
        self.counters = Counters()
        self.started = time.monotonic()
        self.in_flight = 0
        self._quiet = asyncio.Event()
        self.system = ActorSystem(
            store=self._make_store(config, notices),
            notices=notices,
            mailbox_size=config.mailbox_size,
            debounce_ms=config.debounce_ms,
            debounce_max_ms=config.debounce_max_ms,
            idle_timeout=config.idle_timeout,
            spawn=self.spawn,
            counters=self.counters,
            tokens=tokens,
            history_cache_bytes=config.history_cache_mb * 1024 * 1024,
            read_rules=config.read_rules,
            max_tasks=config.max_tasks,
        )
        self.context = zmq.Context()
        self.socket: zmq.Socket[bytes] = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.socket.setsockopt(zmq.MAXMSGSIZE, config.max_bytes)
        self.socket.setsockopt(zmq.LINGER, 0)
        if any("[" in endpoint for endpoint in config.endpoints):
            self.socket.setsockopt(zmq.IPV6, 1)
        self.gate = AcceptGate(self.socket)
        fd = self.socket.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        self._draining = False
        self._drain_scheduled = False
        self._reading = False
        self._outbox: list[tuple[list[bytes], bytes]] = []
        self._user: str | None = None
        self._routes = self._build_routes()

    def _make_store(self, config: Config, notices: engine.Notices) -> StateStore:
        """The file store, or the Redis one for a Redis ``state_store`` URL.

        Raises:
            StartupError: the Redis store is asked for without the ``redis`` extra.
        """
        if config.state_store == "file:":
            return FileStore(config.state_dir, notices, config.advertised)
        if not redis_available():
            raise StartupError(
                "--state-store is a Redis URL but the redis package is missing: "
                "pip install 'ctxwin[redis]'"
            )
        # Test mode only (the hand-over proofs): an audit list, or no fence check at all.
        test = set(os.environ.get("CTXWIN_STORE_TEST", "").split(","))
        ttl_s = config.lease_ttl_ms / 1000
        redis = RedisStore(
            config.state_store,
            config.advertised,
            password=config.state_store_password,
            prefix=config.store_prefix,
            lease_ttl_ms=config.lease_ttl_ms,
            wait_replicas=config.store_wait_replicas,
            timeout_s=max(0.2, min(2.0, ttl_s / 3)),
            audit="audit" in test,
            fence_check="no-fence-check" not in test,
        )
        return RedisStateStore(redis, notices, self.spawn)

    # -- plumbing -----------------------------------------------------------------

    def spawn(self, function: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a coroutine function in the daemon's task group."""
        assert self.task_group is not None
        self.task_group.start_soon(function)

    def bind(self) -> None:
        """Bind every configured endpoint and gate its accepts (see :class:`AcceptGate`).

        Raises:
            StartupError: an endpoint cannot be bound, or the open-files limit
                leaves room for fewer than 8 clients.
        """
        # libzmq takes a listener's mechanism from the socket's options at bind time:
        # ipc endpoints first (NULL), then CURVE for every TCP one, with the ZAP handler up.
        endpoints = sorted(self.config.endpoints, key=lambda e: e.startswith("tcp://"))
        for endpoint in endpoints:
            curve = endpoint.startswith("tcp://") and self.keys is not None
            if curve and self.authenticator is None:
                assert self.keys is not None
                self.authenticator = Authenticator(self.context, self.keys, self.bindings)
                self.authenticator.start()
                self.socket.setsockopt(zmq.CURVE_SERVER, 1)
                self.socket.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)
            try:
                self.socket.bind(endpoint)
            except zmq.ZMQError as exc:
                raise StartupError(f"cannot bind {endpoint}: {exc}") from None
            path = proto.ipc_path(endpoint)
            if path is not None:
                os.chmod(path, 0o600)
            mechanism = "curve" if curve else "null"
            if endpoint.startswith("tcp://") and not proto.is_loopback(endpoint):
                _log.warning(
                    "listening_publicly",
                    endpoint=endpoint,
                    mechanism=mechanism,
                    server_key=self.keys.public.decode() if self.keys else None,
                    bound_clients=sorted(self.bindings),
                )
            else:
                _log.info("listening", endpoint=endpoint, mechanism=mechanism)
        self.gate.start()
        room = self.gate.room() - FD_RESERVE
        if room < MIN_CLIENTS:
            limit = soft_open_files_limit()
            in_use = limit - room - FD_RESERVE
            raise StartupError(
                f"the open-files limit ({limit}) is too low: {in_use} descriptors are in use "
                f"and {FD_RESERVE} are kept for state files, which leaves room for "
                f"{max(room, 0)} clients; ctxwind needs a limit of at least "
                f"{in_use + FD_RESERVE + MIN_CLIENTS} (raise LimitNOFILE= in the unit, "
                "or the hard limit with ulimit -Hn)"
            )

    def start_reading(self) -> None:
        """Start taking requests."""
        self.loop.add_reader(self._fd, self._on_readable)
        self._reading = True
        self._on_readable()  # messages may have queued before the reader was added

    def stop_reading(self) -> None:
        """Stop taking requests (replies can still be sent)."""
        if self._reading:
            self.loop.remove_reader(self._fd)
            self._reading = False

    def close(self) -> None:
        """Close the socket, giving queued replies a moment to leave."""
        self.stop_reading()
        self.gate.close()
        self.socket.close(linger=_CLOSE_LINGER_MS)
        if self.authenticator is not None:
            self.authenticator.close()
        self.context.term()

    def reply_done(self) -> None:
        """Note that one request waiting for a reply got it."""
        self.in_flight -= 1
        if self.in_flight <= 0:
            self._quiet.set()

    def send(self, envelope: list[bytes], body: bytes) -> None:
        """Send one reply; never raises (a vanished peer's reply is dropped).

        Replies made while a wake-up drains a burst wait and leave together, 32
        at a time and the rest when the drain ends (the first few messages of a
        wake-up are answered at once, see ``_on_readable``): libzmq wakes its
        I/O thread (an eventfd write and a context switch) for a message sent
        once that thread has caught up, so replies sent one by one between
        requests cost a wake-up each. Measured with 8 pipelining clients
        (bench/wire.py): throughput 70000 -> 105000 pings/s, libzmq's thread
        2.6 -> 1.9 us per ping.
        """
        if self._draining:
            self._outbox.append((envelope, body))
            if len(self._outbox) >= _SEND_BATCH:
                self._send_outbox()
            return
        self._outbox.append((envelope, body))
        self._send_outbox()
        self._check_events()

    def _send_outbox(self) -> None:
        sock = self.socket
        outbox, self._outbox = self._outbox, []
        for envelope, body in outbox:
            try:
                for part in envelope:
                    _send(sock, part, _SNDMORE_NOBLOCK)
                _send(sock, body, _NOBLOCK)
            except zmq.ZMQError as exc:
                _log.warning("reply_dropped", error=str(exc))

    def _check_events(self) -> None:
        # A send may have consumed the FD's edge for a pending incoming message.
        if self._reading and not self._drain_scheduled and _get(self.socket, _EVENTS) & _POLLIN:
            self._drain_scheduled = True
            self.loop.call_soon(self._on_readable)

    def log_failure(
        self, exc: BaseException, request_id: int | None, op: str, task: str | None
    ) -> None:
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

    # -- receiving ------------------------------------------------------------------

    def _on_readable(self) -> None:
        self._drain_scheduled = False
        if not self._reading:
            return
        sock = self.socket
        self._draining = True
        try:
            for handled in range(_DRAIN_BUDGET):
                # Reading EVENTS (1.8 us) re-arms the edge-triggered FD when nothing
                # is left, as does a recv that fails with EAGAIN (9 us, the cost of
                # the exception). A wake-up usually brings one message: check
                # EVENTS first (after sending the replies so far, so that a lone
                # request's reply leaves at once); deep into a burst, checking
                # every message costs more than one failed recv at its end.
                if handled < _EVENTS_CHECKS:
                    if self._outbox:
                        self._send_outbox()
                    if not _get(sock, _EVENTS) & _POLLIN:
                        return
                try:
                    frames = self._receive(sock)
                except zmq.Again:
                    return
                except zmq.ZMQError as exc:
                    _log.warning("receive_failed", error=str(exc))
                    return
                if frames is not None:
                    self._handle_frames(frames)
            # Budget spent: let actors and timers run, then go on.
            self._drain_scheduled = True
            self.loop.call_soon(self._on_readable)
        finally:
            self._draining = False
            if self._outbox:
                self._send_outbox()
                self._check_events()

    def _receive(self, sock: zmq.Socket[bytes]) -> list[bytes] | None:
        """One message, frame by frame, within the frame and byte caps.

        Returns None when the message broke a cap (the reply is sent here).
        With client bindings configured, the client's name (``User-Id``, set by
        the ZAP handler; none over ipc) is kept in :attr:`_user`.
        """
        limits = self.limits
        # The first frame is the peer's routing id, which a ROUTER always follows
        # with the peer's frames: received as bytes (0.12 us). The others with
        # copy=False for Frame.more: about half the cost of recv + getsockopt(RCVMORE).
        first = _recv(sock, _NOBLOCK, True)
        frame = _recv(sock, _NOBLOCK, False)
        frames = [first, frame.bytes]
        total = len(frames[1])  # the peer's bytes: the routing id is the ROUTER's own
        too_many = False
        while frame.more:
            frame = _recv(sock, _NOBLOCK, False)
            total += len(frame)
            if len(frames) < limits.max_frames:
                frames.append(frame.bytes)
            else:
                too_many = True  # keep receiving, keep nothing: the message must be consumed
        self.counters.requests += 1
        if self.bindings:
            try:
                user = frame.get("User-Id")
                self._user = user if isinstance(user, str) else None
            except zmq.ZMQError:
                self._user = None  # a NULL connection (ipc, or loopback TCP without keys)
        if too_many or total > limits.max_total_bytes:
            reason = (
                f"message has more than {limits.max_frames} frames"
                if too_many
                else f"message of {total} bytes exceeds {limits.max_total_bytes}"
            )
            _log.info("request_refused", code="too_large", reason=reason)
            envelope = _bare_envelope(frames)
            request_id = proto.peek_request_id(frame.buffer)  # the body is the last frame
            self.send(envelope, proto.encode_error(request_id, proto.ErrorCode.TOO_LARGE, reason))
            return None
        return frames

    def _handle_frames(self, frames: list[bytes]) -> None:
        envelope, body = _split(frames)
        if body is None:
            _log.info("request_refused", code="bad_request", reason="not one body frame")
            self.send(
                envelope,
                proto.encode_error(
                    None,
                    proto.ErrorCode.BAD_REQUEST,
                    "a request is one body frame, optionally after an empty delimiter frame",
                ),
            )
            return
        if len(body) > SLICED_DECODE_BYTES:
            user = self._user
            self.spawn(lambda: self._handle_large(envelope, body, user))
            return
        request_id: int | None = None
        op = "?"
        try:
            request_id, op, args = _decode_request(body, self.limits)
        except Exception as exc:
            self.log_failure(exc, request_id, op, None)
            self.send(envelope, _error_reply(exc, request_id, op))
            return
        self._dispatch(envelope, request_id, op, args, self._user)

    async def _handle_large(self, envelope: list[bytes], body: bytes, user: str | None) -> None:
        """A large request: decoded in slices (``_decode.py``) so others are answered meanwhile.

        Requests that arrive while it is decoded may be answered before it.
        """
        self.in_flight += 1  # the shutdown waits for its reply
        try:
            try:
                request_id, op, args = await decode_in_slices(
                    body, self.limits, self.config.max_messages
                )
            except TooManyMessages as exc:
                peeked = proto.peek_request_id(body)
                error = proto.ProtocolError(
                    proto.ErrorCode.TOO_LARGE, self._too_many(exc.field, exc.count), peeked
                )
                self.log_failure(error, peeked, "?", None)
                self.send(envelope, _error_reply(error, peeked, "?"))
                return
            except Exception as exc:
                self.log_failure(exc, None, "?", None)
                self.send(envelope, _error_reply(exc, None, "?"))
                return
            self._dispatch(envelope, request_id, op, args, user)
        finally:
            self.reply_done()

    def _dispatch(
        self,
        envelope: list[bytes],
        request_id: int,
        op: str,
        args: dict[str, Any],
        user: str | None,
    ) -> None:
        """Check a decoded request and route it (the reply is sent now or by its actor)."""
        task: str | None = None
        try:
            if self.bindings and user is not None:  # before the args say anything
                self._check_binding(user, op, args.get("task"))
            proto.validate_args(op, args)
            self._check_message_count(op, args)
            task = args.get("task")
            result = self._routes[op](envelope, request_id, op, args, task)
            if result is not None:
                self.send(envelope, _encode_result(request_id, result))
        except Exception as exc:
            self.log_failure(exc, request_id, op, task)
            self.send(envelope, _error_reply(exc, request_id, op))

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

    def _check_binding(self, user: str, op: str, task: object) -> None:
        """Refuse a bound client's request for a task outside its prefixes (``forbidden``)."""
        prefixes = self.bindings.get(user)
        if prefixes is None or not isinstance(task, str | None):
            return  # not a task id: the args check refuses it
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

    # -- dispatch: one route per op ------------------------------------------------
    #
    # A route answers at once (returns the result map) or later through a
    # _WireReply (returns None); it raises for a refusal.

    def _build_routes(self) -> dict[str, _Route]:
        own: dict[str, _Route] = {
            "ping": self._ping,
            "stats": self._stats,
            "flush": self._flush,
            "close": self._close,
            "count_tokens": self._count_tokens,
            "should_compact": self._should_compact,
        }
        return {
            op: own.get(op) or (self._to_actor if spec.needs_task else self._free)
            for op, spec in proto.OPS.items()
        }

    def _ping(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        return _PING_RESULT

    def _stats(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        return self.statistics().wire()

    def _free(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        return run_free_op(op, args, self.tokens)

    def _to_actor(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        reply = _WireReply(self, envelope, request_id, op, task)
        try:
            actor = self.system.actor_for(task, bool(args.get("ephemeral", False)))
            actor.tell(op, args, reply)
        except Exception:
            self.reply_done()
            raise
        return None

    def _close(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> dict[str, Any] | None:
        if self.system.get(task) is None:
            return {"closed": False, "loaded": False}  # nothing loaded: this call closed nothing
        return self._to_actor(envelope, request_id, op, args, task)

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
        reply = _WireReply(self, envelope, request_id, op, task)
        if task is None:

            async def flush_all() -> None:
                try:
                    written = await self.system.flush_all()
                except Exception as exc:
                    reply.set_exception(exc)
                else:
                    reply.set_result({"flushed": written})

            self.spawn(flush_all)
            return None
        actor = self.system.get(task)
        if actor is not None:
            try:
                actor.tell("flush", {}, reply, force=True)
            except ActorStoppedError as exc:
                reply.set_exception(exc)
            return None
        stopping = self.system.stopping_actor(task)
        if stopping is None:
            reply.set_result({"flushed": 0, "loaded": False})
            return None

        async def wait_for_stop() -> None:
            await stopping.done.wait()
            reply.set_result({"flushed": 0, "loaded": True})  # it flushed as it stopped

        self.spawn(wait_for_stop)
        return None

    def statistics(self) -> DaemonStatistics:
        """The daemon's counts now."""
        counts = self.system.statistics()
        return DaemonStatistics(
            tasks=counts["tasks"],
            actors=counts["actors"],
            requests=self.counters.requests,
            flushes=self.counters.flushes,
            write_failures=self.counters.write_failures,
            uptime_s=round(time.monotonic() - self.started, 3),
            histories=counts["histories"],
            history_bytes=counts["history_bytes"],
            calibrated_tasks=counts["calibrated_tasks"],
            calibration_median=counts["calibration_median"],
            store=self.system.store.describe(),
            cache=counts["cache"],
        )

    async def shutdown(self) -> bool:
        """Stop accepting, finish what is queued, flush every task.

        Returns:
            Whether every task's state is durable.
        """
        self.stop_reading()
        await self.system.stop_all(_SHUTDOWN_GRACE_S)
        with anyio.move_on_after(_SHUTDOWN_GRACE_S):
            while self.in_flight > 0:
                self._quiet.clear()
                await self._quiet.wait()
        await self.system.store.close()
        return self.system.final_flush_failures == 0 and not self.system.actors


_Route = Callable[[list[bytes], int, str, dict[str, Any], Any], dict[str, Any] | None]


def _split(frames: list[bytes]) -> tuple[list[bytes], bytes | None]:
    """A message's envelope (what the reply goes back with) and its body frame.

    ``[peer, body]`` or ``[peer, ..., b"", body]``; any other shape has no
    body (None) and is answered on ``[peer, b""]`` or ``[peer]``.
    """
    count = len(frames)
    if count == 2:
        return frames[:1], frames[1]
    if count >= 3 and frames[-2] == b"":
        return frames[:-1], frames[-1]
    return _bare_envelope(frames), None


def _bare_envelope(frames: list[bytes]) -> list[bytes]:
    """The envelope of a message refused before its body is read: the peer, and a delimiter."""
    return [frames[0], b""] if len(frames) > 2 and frames[1] == b"" else frames[:1]


def _code_of(exc: BaseException) -> str:
    if isinstance(exc, proto.ProtocolError):
        return exc.code.value
    return proto.ErrorCode.BUSY.value
