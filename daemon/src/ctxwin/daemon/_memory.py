"""Giving memory back to the system after idle eviction stopped many actors."""

from __future__ import annotations

import ctypes
import gc
import os
import time
from collections.abc import Callable
from typing import cast

import anyio
import anyio.to_thread
import structlog

from ._actors import ActorSystem

__all__ = ["MemoryRelease", "compact_known_tasks"]

_log = structlog.get_logger("ctxwin.daemon.memory")

# A release follows a poll that saw no actor stop, after at least this many
# stopped since the last one, and at most once per interval.
_RELEASE_AFTER_STOPPED = 256
_RELEASE_POLL_S = 2.0
_RELEASE_MIN_INTERVAL_S = 10.0

COMPACT_MAX_TASKS = 100_000
"""Above this many known task ids they are not compacted (about 37 ms per 100000)."""


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on another C library."""
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return None
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, ValueError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return cast(Callable[[int], int], trim)


def _rss_mib() -> float:
    """This process's resident set size in MiB (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    return round(pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20), 1)


def compact_known_tasks(system: ActorSystem, limit: int = COMPACT_MAX_TASKS) -> bool:
    """Re-create the ids of stopped tasks that ``system.known_tasks`` keeps.

    Each id was decoded from a request in the middle of that request's
    allocations, so after the actors stop, a few dozen bytes still pin each
    of CPython's 1 MiB object arenas the actors filled: measured, 72 arenas
    after 5000 actors stopped against 21 before. The ids go into one string,
    the old ones are freed (and with them most of those arenas), then they are
    split again into the arenas still in use. Skipped above 100000 ids, where
    it would hold up the event loop for more than about 40 ms.
    """
    if len(system.known_tasks) > limit:
        return False
    live = system.actors
    known = system.known_tasks
    joined = "\n".join(task for task in known if task not in live)  # "\n" is never in an id
    kept = {task for task in known if task in live}
    system.known_tasks = kept
    del known
    if joined:
        kept.update(joined.split("\n"))
    return True


class MemoryRelease:
    """Gives memory back to the system once an idle sweep has stopped many actors.

    Stopped actors' memory returns to CPython's and glibc's allocators, which
    keep it: CPython frees an arena only when all its objects are gone, glibc
    keeps freed pages in its heaps. After at least 256 actors stopped (and a
    poll, 2 s, in which no more stopped), at most every 10 s: collect cycles,
    compact the kept task ids (:func:`compact_known_tasks`), then ``malloc_trim(0)``
    (glibc only) in a worker thread. anyio retires worker threads idle for 10 s
    when it hands out the next job, so the trim also frees the threads the
    actors' writes left behind. Failures are logged, never raised.
    """

    def __init__(self, system: ActorSystem) -> None:
        self.system = system
        self.trim = _load_malloc_trim()
        self.releases = 0
        self._stopped_seen = 0  # actors stopped since start, at the last poll
        self._stopped_released = 0  # the same, at the last release
        self._last_release = -_RELEASE_MIN_INTERVAL_S

    def note(self, stopped: int, now: float) -> bool:
        """Take one poll's count of actors stopped since start; whether to release now."""
        quiet = stopped == self._stopped_seen
        self._stopped_seen = stopped
        return (
            quiet
            and stopped - self._stopped_released >= _RELEASE_AFTER_STOPPED
            and now - self._last_release >= _RELEASE_MIN_INTERVAL_S
        )

    async def release(self) -> None:
        """Collect, compact and trim; log what it gave back."""
        self._last_release = time.monotonic()
        stopped = self._stopped_seen - self._stopped_released
        self._stopped_released = self._stopped_seen
        before = _rss_mib()
        started = time.perf_counter()
        try:
            gc.collect()
            compact_known_tasks(self.system)
            trimmed = None
            if self.trim is not None:
                trimmed = bool(await anyio.to_thread.run_sync(self.trim, 0))
        except Exception as exc:
            _log.warning("memory_release_failed", error=f"{type(exc).__name__}: {exc}")
            return
        self.releases += 1
        _log.info(
            "memory_released",
            stopped_actors=stopped,
            actors=len(self.system.actors),
            rss_before_mib=before,
            rss_after_mib=_rss_mib(),
            trimmed=trimmed,
            ms=round((time.perf_counter() - started) * 1000, 1),
        )

    async def run(self) -> None:
        """Poll the actor count and release after sweeps, forever (runs as a task)."""
        while True:
            await anyio.sleep(_RELEASE_POLL_S)
            stopped = self.system.started - len(self.system.actors)
            if self.note(stopped, time.monotonic()):
                await self.release()
