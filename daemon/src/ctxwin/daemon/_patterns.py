"""Read-tool patterns compiled one at a time, between other clients' requests (issue 33).

A task's ``read_tools`` may carry RE2 patterns, sent by a client or stored
with the task and compiled again when it loads. RE2 compiles with the
interpreter lock held (measured: a worker thread compiling the issue's
pattern kept the event loop from running for 1.1 s), so a worker thread
would not let other clients be answered meanwhile. What keeps them answered:

- each pattern's cost is bounded (:func:`ctxwin.engine.compile_pattern`:
  1,000 characters, a 256 KiB ``max_mem``, 5,000 instructions: the costliest
  pattern measured takes about 100 ms to refuse);
- at most :data:`ctxwin.proto.MAX_READ_PATTERNS` patterns per task;
- each distinct text is compiled once (the engine keeps the last 256
  programs and refusals by text);
- the daemon compiles one pattern at a time, and hands the loop back before
  each, so a waiting ping is answered between two compiles, however many
  tasks ask at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from ctxwin import engine, proto

__all__ = ["Built", "PatternCompiler"]

_log = structlog.get_logger("ctxwin.daemon.actors")


@dataclass
class Built:
    """Read tools built from their configuration forms.

    Attributes:
        tools: each tool that built, in order.
        refused: ``(position, reason)`` of each one that did not.
        compiled: patterns compiled for this build.
        cached: patterns found compiled (or refused) already.
    """

    tools: list[engine.ReadTool] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    compiled: int = 0
    cached: int = 0


class PatternCompiler:
    """Builds read tools, compiling their patterns one at a time for the whole daemon."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.compiled = 0  # patterns compiled since start (refused ones included)

    async def build(
        self, items: tuple[Mapping[str, Any], ...], *, task: str, stop_at_first: bool
    ) -> Built:
        """Build each tool; the ones past :data:`ctxwin.proto.MAX_READ_PATTERNS` patterns fail.

        Args:
            items: the tools in their configuration form.
            task: the task id (for the log).
            stop_at_first: stop at the first tool that fails (a request is refused whole).
        """
        built = Built()
        patterns = 0
        for position, item in enumerate(items):
            try:
                source = engine.read_tool_pattern(item)
                compiled = None
                if source is not None:
                    patterns += 1
                    if patterns > proto.MAX_READ_PATTERNS:
                        raise ValueError(
                            f"more than {proto.MAX_READ_PATTERNS} read tools with a pattern"
                        )
                    compiled = await self._compile(source, built)
                built.tools.append(engine.read_tool_from_config(item, compiled))
            except ValueError as exc:
                built.refused.append((position, str(exc)))
                if stop_at_first:
                    break
        if built.compiled or built.cached:
            _log.info(
                "read_tool_patterns_compiled",
                task=task,
                compiled=built.compiled,
                cached=built.cached,
            )
        return built

    async def _compile(self, source: str, built: Built) -> Any:
        """``source`` compiled (or refused, ValueError), after the loop ran once."""
        found = _cached(source, built)
        if found is not None:
            return found
        async with self._lock:
            await asyncio.sleep(0)  # what waits (another client's ping) goes first
            found = _cached(source, built)  # compiled while this one waited
            if found is not None:
                return found
            built.compiled += 1
            self.compiled += 1
            return engine.compile_pattern(source)


def _cached(source: str, built: Built) -> Any:
    """The compiled pattern of ``source`` if known (ValueError if refused before), else None."""
    try:
        found = engine.cached_pattern(source)
    except ValueError:
        built.cached += 1
        raise
    if found is not None:
        built.cached += 1
    return found
