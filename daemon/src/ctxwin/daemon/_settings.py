"""A task's settings besides its state: its dialect, its own read tools, whether it persists.

A task's dialect is fixed at its first use (a stored task has it already);
its own read tools (``read_tools``, docs/DIALECTS.md) are counted besides the
daemon's table and stored with it; an ephemeral task is kept in memory only.
Every check here runs before a request changes anything (see
:meth:`~._session.TaskSession.handle`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from ctxwin import engine, proto

from ._patterns import PatternCompiler

__all__ = ["TaskSettings"]

_log = structlog.get_logger("ctxwin.daemon.actors")

_CLINE_READ_TOOLS = (
    "read_tools applies to the native dialects; the cline dialect recognises a read "
    "by its result's header (SPEC.md §6)"
)

Tools = tuple[tuple[dict[str, Any], ...], tuple[engine.ReadTool, ...]]
"""Read tools in their wire form, and as built."""


class TaskSettings:
    """The dialect, read tools and persistence of one task.

    Args:
        task: the task id (for errors and logs).
        ephemeral: keep the state in memory only; never load or write it.
        read_rules: the daemon's read tools, which a native dialect counts.
        patterns: compiles the patterns of the task's own read tools.
    """

    def __init__(
        self,
        task: str,
        ephemeral: bool,
        read_rules: engine.ReadRules,
        patterns: PatternCompiler,
    ) -> None:
        self.task = task
        self._patterns = patterns
        self.ephemeral = ephemeral
        self.only_inspected = True  # every request so far was an inspect (see become_ephemeral)
        self._read_rules = read_rules
        self._dialect_fixed = False  # the task's dialect is fixed at its first use
        # The task's own read tools (wire form) and the tools built from them.
        self.read_tools: tuple[dict[str, Any], ...] = ()
        self._own_tools: tuple[engine.ReadTool, ...] = ()
        self.read_tool_changes = 0  # counted in the revision: they are stored
        # Stored tools that no longer build: [position, reason], kept aside, never run.
        self.unused_tools: tuple[tuple[int, str], ...] = ()

    async def loaded(
        self, state: engine.TaskState, stored_tools: tuple[dict[str, Any], ...]
    ) -> None:
        """Take a loaded (or new) state's settings and the stored read tools."""
        await self._load_read_tools(stored_tools)
        # A stored task has its dialect already; a new one gets it from its first call.
        self._dialect_fixed = not state.empty
        state.set_dialect(state.dialect, self._reads(state.dialect.name))

    def _reads(self, dialect: str) -> engine.ReadRules | None:
        """The read tools a task of ``dialect`` counts (None: Cline's own rules, SPEC.md §6)."""
        if dialect == engine.CLINE:
            return None
        own = self._own_tools
        return self._read_rules.extended(own) if own else self._read_rules

    async def _load_read_tools(self, stored: tuple[dict[str, Any], ...]) -> None:
        """Take the stored read tools; each one that no longer builds is kept aside, not used.

        A pattern RE2 refuses (a backreference, one too large) is such a tool,
        as is one past :data:`ctxwin.proto.MAX_READ_PATTERNS` patterns: the
        log and ``inspect``'s ``read_tools_unused`` name it and the reason.
        Patterns are compiled as a request's are (``_patterns.py``).
        """
        self.read_tools = stored
        built = await self._patterns.build(stored, task=self.task, stop_at_first=False)
        for position, reason in built.refused:
            _log.warning("stored_read_tools_unused", task=self.task, tool=position, error=reason)
        self._own_tools = tuple(built.tools)
        self.unused_tools = tuple(built.refused)

    def check_dialect(self, state: engine.TaskState, op: str, args: dict[str, Any]) -> bool:
        """Fix the task's dialect at its first use; refuse a call that names another.

        Returns:
            Whether the state's dialect changed (the kept history follows it).

        Raises:
            ProtocolError: ``bad_request`` when the call's ``dialect`` is not the task's.
        """
        asked = args.get("dialect")
        changed = False
        if asked is not None and asked != state.dialect.name:
            if self._dialect_fixed:
                raise proto.ProtocolError(
                    proto.ErrorCode.BAD_REQUEST,
                    f"{op}: task {self.task} has dialect {state.dialect.name!r}, not {asked!r} "
                    "(a task's dialect is fixed at its first use; close it, or use another "
                    "task id)",
                )
            if asked == engine.CLINE and self._own_tools:
                raise proto.ProtocolError(proto.ErrorCode.BAD_REQUEST, f"{op}: {_CLINE_READ_TOOLS}")
            state.set_dialect(engine.get_dialect(asked), self._reads(asked))
            changed = True
        if op != "inspect":
            self._dialect_fixed = True
        return changed

    async def wanted_tools(
        self, state: engine.TaskState, op: str, args: dict[str, Any]
    ) -> Tools | None:
        """The read tools a request gives, built; None when it gives none or the ones in use.

        Raises:
            ProtocolError: ``bad_request`` naming the tool that is not of the
                configuration form, or for a task of the Cline dialect.
        """
        asked = args.get("read_tools")
        if asked is None:
            return None
        wanted = tuple(asked)
        if wanted == self.read_tools and len(self._own_tools) == len(wanted):
            return None
        built = await self._patterns.build(wanted, task=self.task, stop_at_first=True)
        if built.refused:
            [(position, reason)] = built.refused
            raise proto.ProtocolError(
                proto.ErrorCode.BAD_REQUEST, f"{op}: read_tools[{position}]: {reason}"
            )
        dialect = args.get("dialect") or state.dialect.name
        if built.tools and dialect == engine.CLINE:
            raise proto.ProtocolError(proto.ErrorCode.BAD_REQUEST, f"{op}: {_CLINE_READ_TOOLS}")
        return wanted, tuple(built.tools)

    def use_tools(self, state: engine.TaskState, tools: Tools) -> None:
        """Make these the task's own read tools (besides the daemon's table)."""
        self.read_tools, self._own_tools = tools
        self.unused_tools = ()  # every tool sent was built
        self.read_tool_changes += 1
        state.set_dialect(state.dialect, self._reads(state.dialect.name))

    def tools(self) -> tuple[Tools, tuple[tuple[int, str], ...]]:
        """The read tools in use and those kept aside, for :meth:`restore`."""
        return (self.read_tools, self._own_tools), self.unused_tools

    def restore(
        self, state: engine.TaskState, saved: tuple[Tools, tuple[tuple[int, str], ...]]
    ) -> None:
        """Put back the read tools of before a refused request (it leaves them unset)."""
        tools, unused = saved
        if (self.read_tools, self._own_tools) != tools:
            self.use_tools(state, tools)
            self.unused_tools = unused

    def become_ephemeral(self, state: engine.TaskState, dirty: Callable[[], bool]) -> None:
        """Keep the task in memory only from now on, as a request asks, if nothing is lost.

        A task that so far only answered ``inspect`` (someone looked at an
        ephemeral task after its idle eviction, say) with nothing stored is
        taken over. Any other persistent task is in use as one, with state or
        soon to have it, and is not.

        Raises:
            ProtocolError: ``bad_request`` when the task is in use as a persistent one.
        """
        if (
            not self.only_inspected
            or state.deleted_range is not None
            or state.dump_updates()
            or dirty()
        ):
            raise proto.ProtocolError(
                proto.ErrorCode.BAD_REQUEST,
                f"task {self.task} is open as a persistent task; ephemeral applies only to "
                "a new task (close it first, or use another task id)",
            )
        self.ephemeral = True
        _log.info("actor_made_ephemeral", task=self.task)
