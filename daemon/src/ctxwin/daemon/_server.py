"""The ROUTER socket, request envelopes, dispatch, and the daemon's lifecycle.

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
durable already; ephemeral tasks never count); ``close`` answers
``{"closed": true}`` (also for a task that was not loaded); ``stats.tasks``
counts the distinct task ids served since start, ``stats.actors`` the actors
running now. Requests queued behind a ``close`` of the same task, or on an
actor that stops, are answered ``busy`` (send again).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.abc
import anyio.to_thread
import msgpack
import structlog
import zmq

from ctxwin import engine, proto

from ._accept import FD_RESERVE, MIN_CLIENTS, AcceptGate, soft_open_files_limit
from ._actors import ActorStoppedError, ActorSystem, BusyError, Counters, FlushError
from ._config import Config
from ._memory import MemoryRelease
from ._notify import Notifier
from ._ops import run_free_op, wants_actor
from ._persist import LockedError, acquire_lock
from ._tokens import TokenCounter

__all__ = ["DaemonStatistics", "Server", "StartupError", "run_daemon"]

_log = structlog.get_logger("ctxwin.daemon.server")

# Messages handled per wake-up before yielding to actors and timers.
_DRAIN_BUDGET = 256
_EVENTS_CHECKS = 4
# Replies made while draining leave in batches of at most this many (see Server.send).
_SEND_BATCH = 32
_STATUS_INTERVAL_S = 10.0

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
# What the codec does per request, without what it costs on this path: msgpack.packb
# builds a Packer per call (0.79 -> 0.41 us for a ping reply), and decode_request's
# checks take 1.2 us where the well-formed case needs 0.5 (_decode_request).
_pack = msgpack.Packer(use_bin_type=True).pack
_unpackb = msgpack.unpackb
_PROTOCOL_VERSION = proto.PROTOCOL_VERSION
_PING_RESULT: dict[str, Any] = {
    "pong": True,
    "version": proto.__version__,
    "proto": proto.PROTOCOL_VERSION,
    "features": list(proto.FEATURES),
}
_CLOSE_LINGER_MS = 2000
_FORCE_AFTER_S = 2.0


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
        history_bytes: their encoded size (the cap is ``--history-cache-mb``).
        calibrated_tasks: running tasks whose estimates have been calibrated.
        calibration_median: the median of their ratios (reported/estimated).
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
        }


def _decode_request(body: bytes, limits: proto.Limits) -> tuple[int, str, dict[str, Any]]:
    """``proto.decode_request`` for the well-formed request, cheaply: (id, op, args).

    A map of exactly ``v`` (the protocol version), ``id`` (an int), ``op`` (a
    str) and ``args`` (a map) is taken as it is; anything else goes through
    ``proto.decode_request``, which accepts it the same way or raises the
    exact error.

    Raises:
        ProtocolError: as ``proto.decode_request``.
    """
    if len(body) <= limits.max_frame_bytes:
        try:
            value = _unpackb(body, raw=False, strict_map_key=True)
        except Exception:
            value = None
        if type(value) is dict and len(value) == 4:
            request_id = value.get("id")
            version = value.get("v")
            op = value.get("op")
            args = value.get("args")
            if (
                type(request_id) is int
                and type(version) is int
                and version == _PROTOCOL_VERSION
                and type(op) is str
                and type(args) is dict
            ):
                return request_id, op, args
    request = proto.decode_request(body, limits)
    return request.id, request.op, request.args


_PEEK_BYTES = 64


def peek_request_id(body: bytes | memoryview) -> int | None:
    """The ``id`` of a request body too large to decode, read from its first bytes.

    Clients write ``v`` and ``id`` first, so a refusal can name the request it
    refuses and a caller with several requests in flight gets the error on the
    right one. None when the first bytes do not show an integer id.
    """
    unpacker = msgpack.Unpacker(max_buffer_size=_PEEK_BYTES)
    unpacker.feed(body[:_PEEK_BYTES])
    try:
        for _ in range(min(unpacker.read_map_header(), 4)):
            if unpacker.unpack() == "id":
                value = unpacker.unpack()
                return value if type(value) is int else None
            unpacker.skip()
    except (ValueError, msgpack.UnpackException, msgpack.OutOfData):
        return None
    return None


def _encode_result(request_id: int, result: dict[str, Any]) -> bytes:
    """``proto.encode_result``, byte for byte, with one Packer for the process."""
    return _pack({"v": _PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result})


def _error_reply(exc: BaseException, request_id: int | None, op: str) -> bytes:
    """Encode the error reply for an exception raised while handling a request."""
    if isinstance(exc, proto.ProtocolError):
        return proto.encode_error(
            request_id if exc.request_id is None else exc.request_id, exc.code, exc.message
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
            config.state_dir,
            notices,
            config.mailbox_size,
            config.debounce_ms,
            config.debounce_max_ms,
            config.idle_timeout,
            self.spawn,
            self.counters,
            tokens,
            config.history_cache_mb * 1024 * 1024,
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
        for endpoint in self.config.endpoints:
            try:
                self.socket.bind(endpoint)
            except zmq.ZMQError as exc:
                raise StartupError(f"cannot bind {endpoint}: {exc}") from None
            if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
                os.chmod(endpoint[len("ipc://") :], 0o600)
            _log.info("listening", endpoint=endpoint)
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
        if too_many or total > limits.max_total_bytes:
            reason = (
                f"message has more than {limits.max_frames} frames"
                if too_many
                else f"message of {total} bytes exceeds {limits.max_total_bytes}"
            )
            _log.info("request_refused", code="too_large", reason=reason)
            envelope = [frames[0], b""] if len(frames) > 2 and frames[1] == b"" else frames[:1]
            request_id = peek_request_id(frame.buffer)  # the body is the last frame
            self.send(envelope, proto.encode_error(request_id, proto.ErrorCode.TOO_LARGE, reason))
            return None
        return frames

    def _handle_frames(self, frames: list[bytes]) -> None:
        count = len(frames)
        if count == 2:
            envelope = frames[:1]
        elif count >= 3 and frames[-2] == b"":
            envelope = frames[:-1]
        else:
            envelope = [frames[0], b""] if count > 2 and frames[1] == b"" else frames[:1]
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
        request_id: int | None = None
        op = "?"
        task: str | None = None
        try:
            request_id, op, args = _decode_request(frames[-1], self.limits)
            proto.validate_args(op, args)
            task = args.get("task")
            self._dispatch(envelope, request_id, op, args, task)
        except Exception as exc:
            self.log_failure(exc, request_id, op, task)
            self.send(envelope, _error_reply(exc, request_id, op))

    def _dispatch(
        self, envelope: list[bytes], request_id: int, op: str, args: dict[str, Any], task: Any
    ) -> None:
        if op == "ping":
            result = _PING_RESULT
        elif op == "stats":
            result = self.statistics().wire()
        elif op == "flush":
            self._flush(envelope, request_id, task)
            return
        elif op == "close" and self.system.get(task) is None:
            result = {"closed": True}
        elif op == "count_tokens":
            self._count_tokens(envelope, request_id, args)
            return
        elif wants_actor(op, args):
            reply = _WireReply(self, envelope, request_id, op, task)
            try:
                actor = self.system.actor_for(task, bool(args.get("ephemeral", False)))
                actor.tell(op, args, reply)
            except Exception:
                self.reply_done()
                raise
            return
        else:
            result = run_free_op(op, args, self.tokens)
        self.send(envelope, _encode_result(request_id, result))

    def _count_tokens(self, envelope: list[bytes], request_id: int, args: dict[str, Any]) -> None:
        """Count in a worker thread: a cold 1 MB count takes 50-100 ms of the event loop."""
        reply = _WireReply(self, envelope, request_id, "count_tokens", None)

        async def count() -> None:
            try:
                result = await anyio.to_thread.run_sync(
                    run_free_op, "count_tokens", args, self.tokens
                )
            except Exception as exc:
                reply.set_exception(exc)
            else:
                reply.set_result(result)

        self.spawn(count)

    def _flush(self, envelope: list[bytes], request_id: int, task: str | None) -> None:
        reply = _WireReply(self, envelope, request_id, "flush", task)
        if task is None:

            async def flush_all() -> None:
                try:
                    written = await self.system.flush_all()
                except Exception as exc:
                    reply.set_exception(exc)
                else:
                    reply.set_result({"flushed": written})

            self.spawn(flush_all)
            return
        actor = self.system.get(task)
        if actor is not None:
            try:
                actor.tell("flush", {}, reply, force=True)
            except ActorStoppedError as exc:
                reply.set_exception(exc)
            return
        stopping = self.system.stopping_actor(task)
        if stopping is None:
            reply.set_result({"flushed": 0})
            return

        async def wait_for_stop() -> None:
            await stopping.done.wait()
            reply.set_result({"flushed": 0})

        self.spawn(wait_for_stop)

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
        return self.system.final_flush_failures == 0 and not self.system.actors


def _code_of(exc: BaseException) -> str:
    if isinstance(exc, proto.ProtocolError):
        return exc.code.value
    return proto.ErrorCode.BUSY.value


# -- lifecycle --------------------------------------------------------------------


def _ipc_path(endpoint: str) -> Path | None:
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        return Path(endpoint[len("ipc://") :])
    return None


def _make_private_dir(directory: Path, *, default: bool) -> None:
    """Create ``directory`` (0700), or check an existing one is safe to put a socket in.

    An existing directory owned by another uid is refused when it is the
    default one (anyone can create ``/tmp/ctxwin-<uid>`` first and then swap
    the socket) or when others may write to it; the default one is tightened
    to 0700.

    Raises:
        StartupError: the directory is not ours to use.
    """
    existed = os.path.lexists(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise StartupError(f"socket dir {directory} is not a directory")
    if info.st_uid != os.getuid():
        if default or info.st_mode & 0o022:
            raise StartupError(
                f"socket dir {directory} belongs to uid {info.st_uid} "
                f"(mode {stat.S_IMODE(info.st_mode):o}); refusing to put the socket there"
            )
        return
    if (not existed or default) and stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(directory, 0o700)


@contextlib.contextmanager
def _locks(config: Config) -> Iterator[list[Path]]:
    """Take the state dir's lock and one beside each ipc socket; remove stale sockets.

    Yields the ipc socket paths (removed again on exit, lock still held).

    Raises:
        StartupError: a lock is held by another daemon, or a directory is unusable.
    """
    fds: list[int] = []
    sockets: list[Path] = []
    try:
        try:
            config.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            (config.state_dir / "tasks").mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"state dir {config.state_dir} is not usable: {exc}") from None
        if not os.access(config.state_dir / "tasks", os.W_OK | os.X_OK):
            raise StartupError(f"state dir {config.state_dir} is not writable")
        lock = config.state_dir / "ctxwind.lock"
        try:
            fds.append(acquire_lock(lock))
        except LockedError:
            raise StartupError(
                f"another ctxwind is using the state dir {config.state_dir} (lock {lock} is held)"
            ) from None
        except OSError as exc:
            raise StartupError(f"cannot create lock file {lock}: {exc}") from None
        default_dir = proto.default_runtime_dir()
        for endpoint in config.endpoints:
            path = _ipc_path(endpoint)
            if path is None:
                continue
            try:
                _make_private_dir(path.parent, default=path.parent == default_dir)
            except OSError as exc:
                raise StartupError(f"cannot create socket dir {path.parent}: {exc}") from None
            lock = path.with_name(path.name + ".lock")
            try:
                fds.append(acquire_lock(lock))
            except LockedError:
                raise StartupError(
                    f"another ctxwind is listening on {endpoint} (lock {lock} is held)"
                ) from None
            except OSError as exc:
                raise StartupError(f"cannot create lock file {lock}: {exc}") from None
            if path.exists() or path.is_symlink():
                _log.info("stale_socket_removed", path=str(path))
                path.unlink()
            sockets.append(path)
        yield sockets
    finally:
        for path in sockets:
            try:
                path.unlink()
            except OSError:
                pass
        for fd in fds:
            os.close(fd)


async def _watch_signals(stop: anyio.Event) -> None:
    first_at = 0.0
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if not stop.is_set():
                _log.info("signal_received", signal=name)
                first_at = time.monotonic()
                stop.set()
            elif time.monotonic() - first_at < _FORCE_AFTER_S:
                # Wrappers such as timeout(1) signal both the child and its group.
                _log.info("signal_ignored", signal=name, reason="already stopping")
            else:
                # Asked again well after the first: the operator does not want to wait.
                _log.warning("forced_exit", signal=name)
                os._exit(1)


async def _tick(server: Server, notifier: Notifier) -> None:
    """STATUS= lines and WATCHDOG=1 pings from the event loop."""
    interval = notifier.watchdog_interval
    step = min(interval, _STATUS_INTERVAL_S) if interval else _STATUS_INTERVAL_S
    next_status = 0.0
    while True:
        now = time.monotonic()
        if now >= next_status:
            stats = server.statistics()
            notifier.status(
                f"{stats.actors} active tasks, {stats.requests} requests, "
                f"{stats.write_failures} write failures"
            )
            next_status = now + _STATUS_INTERVAL_S
        if interval:
            notifier.watchdog()
        await anyio.sleep(step)


async def run_daemon(
    config: Config,
    notices: engine.Notices,
    tokens: TokenCounter,
    notifier: Notifier,
) -> int:
    """Run ctxwind until SIGTERM or SIGINT.

    Args:
        config: the configuration.
        notices: notice texts.
        tokens: the token counter (loaded in the background at start).
        notifier: the systemd notifier.

    Returns:
        The exit status: 0 once every task's state is durable, 1 otherwise.

    Raises:
        StartupError: a lock is held, a directory is unusable, or a bind failed.
    """
    with _locks(config):
        stop = anyio.Event()
        server = Server(config, notices, tokens)
        try:
            server.bind()
        except BaseException:
            server.close()
            raise
        async with anyio.create_task_group() as task_group:
            server.task_group = task_group
            task_group.start_soon(_watch_signals, stop)
            task_group.start_soon(server.system.reap_idle)
            task_group.start_soon(MemoryRelease(server.system).run)
            task_group.start_soon(anyio.to_thread.run_sync, _preload, tokens)
            server.start_reading()
            notifier.ready()
            task_group.start_soon(_tick, server, notifier)
            _log.info(
                "started",
                pid=os.getpid(),
                state_dir=str(config.state_dir),
                endpoints=list(config.endpoints),
                open_files_limit=soft_open_files_limit(),
                accept_gated=len(server.gate.listeners),
            )
            await stop.wait()
            notifier.stopping()
            _log.info("stopping", actors=len(server.system.actors), in_flight=server.in_flight)
            durable = await server.shutdown()
            task_group.cancel_scope.cancel()
        server.close()
    stats = server.statistics()
    _log.info(
        "stopped",
        durable=durable,
        requests=stats.requests,
        flushes=stats.flushes,
        write_failures=stats.write_failures,
    )
    return 0 if durable else 1


def _preload(tokens: TokenCounter) -> None:
    try:
        tokens.load()
    except Exception as exc:
        _log.error("encoding_unavailable", encoding=tokens.encoding_name, error=str(exc))
