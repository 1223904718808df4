"""The process around the server: locks, private socket dirs, signals, status, ``run_daemon``.

``run_daemon`` is where the daemon is put together: the state store, the
task actors on it, the server on them (which owns the socket).

Start-up takes the state dir's lock and one beside each ipc socket (a second
daemon on either refuses to start), removes stale sockets, binds, then tells
systemd READY=1. SIGTERM or SIGINT stops it: STOPPING=1, no new requests,
every actor drains and flushes within a grace period, exit 0 once every
task's state is durable. A second signal within 2 s is ignored (wrappers
signal both the child and its group); a later one exits at once.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import stat
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import structlog

from ctxwin import engine, proto

from ._accept import soft_open_files_limit
from ._actors import ActorSystem, Counters
from ._config import Config
from ._errors import StartupError
from ._memory import MemoryRelease
from ._notify import Notifier
from ._server import Server
from ._tokens import TokenCounter
from .store import StateStore, StoreOpener, open_store
from .store._files import LockedError, NotOursError, acquire_lock, check_private_dir

__all__ = ["run_daemon"]

_log = structlog.get_logger("ctxwin.daemon.server")

_STATUS_INTERVAL_S = 10.0
_FORCE_AFTER_S = 2.0


def _make_private_dir(directory: Path, *, default: bool) -> None:
    """Create ``directory`` (0700), or check an existing one is safe to put a socket in.

    An existing directory owned by another uid is refused when it is the
    default one (anyone can create ``/tmp/ctxwin-<uid>`` first and then swap
    the socket) or when others may write to it; one of the daemon's own uid
    that others may write to is refused too (another user could replace the
    socket and receive the clients' requests), unless it is the default one,
    which is tightened to 0700.

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
    elif info.st_mode & 0o022:
        raise StartupError(
            f"socket dir {directory} is writable by others (mode "
            f"{stat.S_IMODE(info.st_mode):o}): another user could replace the socket and "
            f"receive the clients' requests; chmod go-w {directory}, or use another directory"
        )


def _take_lock(lock: Path, holder: str) -> int:
    """Take a lock file for the daemon's life; ``holder`` says what another daemon holds it for.

    Raises:
        StartupError: another daemon holds it, or it cannot be created.
    """
    try:
        return acquire_lock(lock)
    except LockedError:
        raise StartupError(f"another ctxwind is {holder} (lock {lock} is held)") from None
    except OSError as exc:
        raise StartupError(f"cannot create lock file {lock}: {exc}") from None


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
        try:
            # Another user's directory, or one others may write to, could hold their
            # links: the lock file and every task file would be written through them.
            check_private_dir(config.state_dir, "state dir", follow=True)
            check_private_dir(config.state_dir / "tasks", "tasks dir", follow=False)
        except NotOursError as exc:
            raise StartupError(f"{exc.strerror}; refusing to use it") from None
        if not os.access(config.state_dir / "tasks", os.W_OK | os.X_OK):
            raise StartupError(f"state dir {config.state_dir} is not writable")
        fds.append(
            _take_lock(config.state_dir / "ctxwind.lock", f"using the state dir {config.state_dir}")
        )
        default_dir = proto.default_runtime_dir()
        for endpoint in config.endpoints:
            path = proto.ipc_path(endpoint)
            if path is None:
                continue
            try:
                _make_private_dir(path.parent, default=path.parent == default_dir)
            except OSError as exc:
                raise StartupError(f"cannot create socket dir {path.parent}: {exc}") from None
            fds.append(_take_lock(path.with_name(path.name + ".lock"), f"listening on {endpoint}"))
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


async def _watch_signals(
    stop: anyio.Event, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    first_at = 0.0
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()  # the handlers are in place: reading may begin
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
                f"{stats['actors']} active tasks, {stats['requests']} requests, "
                f"{stats['write_failures']} write failures"
            )
            next_status = now + _STATUS_INTERVAL_S
        if interval:
            notifier.watchdog()
        await anyio.sleep(step)


class _Spawn:
    """Starts coroutine functions in the daemon's task group, once it is open."""

    def __init__(self) -> None:
        self.task_group: anyio.abc.TaskGroup | None = None

    def __call__(self, function: Callable[[], Coroutine[Any, Any, None]]) -> None:
        assert self.task_group is not None
        self.task_group.start_soon(function)


def _actor_system(
    config: Config,
    store: StateStore,
    notices: engine.Notices,
    tokens: TokenCounter,
    spawn: _Spawn,
) -> ActorSystem:
    return ActorSystem(
        store=store,
        notices=notices,
        mailbox_size=config.mailbox_size,
        debounce_ms=config.debounce_ms,
        debounce_max_ms=config.debounce_max_ms,
        idle_timeout=config.idle_timeout,
        spawn=spawn,
        counters=Counters(),
        tokens=tokens,
        history_cache_bytes=config.history_cache_mb * 1024 * 1024,
        read_rules=config.read_rules,
        max_tasks=config.max_tasks,
    )


async def run_daemon(
    config: Config,
    notices: engine.Notices,
    tokens: TokenCounter,
    notifier: Notifier,
    *,
    stores: StoreOpener = open_store,
) -> int:
    """Run ctxwind until SIGTERM or SIGINT.

    Args:
        config: the configuration.
        notices: notice texts.
        tokens: the token counter (loaded in the background at start).
        notifier: the systemd notifier.
        stores: opens the state store the configuration names
            (:func:`~ctxwin.daemon.store.open_store`).

    Returns:
        The exit status: 0 once every task's state is durable, 1 otherwise.

    Raises:
        StartupError: a lock is held, a directory is unusable, or a bind failed.
    """
    with _locks(config):
        stop = anyio.Event()
        spawn = _Spawn()
        store = stores(config, notices, spawn)
        system = _actor_system(config, store, notices, tokens, spawn)
        server = Server(config, system, tokens, spawn)
        try:
            gated = server.bind()
        except BaseException:
            server.close()
            raise
        async with anyio.create_task_group() as task_group:
            spawn.task_group = task_group
            # Before the first request is read: a client that has its answer may
            # signal at once, and SIGTERM must then stop the daemon cleanly.
            await task_group.start(_watch_signals, stop)
            task_group.start_soon(system.reap_idle)
            task_group.start_soon(MemoryRelease(system).run)
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
                accept_gated=gated,
            )
            await stop.wait()
            notifier.stopping()
            _log.info("stopping", actors=len(system.actors), in_flight=server.in_flight)
            durable = await server.shutdown()
            await store.close()
            task_group.cancel_scope.cancel()
        server.close()
    stats = server.statistics()
    _log.info(
        "stopped",
        durable=durable,
        requests=stats["requests"],
        flushes=stats["flushes"],
        write_failures=stats["write_failures"],
    )
    return 0 if durable else 1


def _preload(tokens: TokenCounter) -> None:
    try:
        tokens.load()
    except Exception as exc:
        _log.error("encoding_unavailable", encoding=tokens.encoding_name, error=str(exc))
    # What is loaded now (modules, the encodings) lives as long as the daemon: out of
    # the collector's sight, a full collection no longer walks it (80-150 ms on a
    # loaded 2-core machine, a stall every client saw behind any large request).
    gc.freeze()
