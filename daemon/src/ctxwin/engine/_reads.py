"""File reads made by native tool calls, for the duplicate-read pass (docs/DIALECTS.md).

In the Cline dialect a read is recognised by the ``[read_file for '...']``
header of its result (SPEC.md §6). In the other dialects a read is a tool
call whose name and arguments name a file, from a table of :class:`ReadTool`
entries; its result is the ``tool_result`` that answers the call.

The task ledger's files read come from here too: :meth:`ReadTool.path` for
the read tools, :func:`shell_reads` for any shell command, built from the same
pieces as :data:`SHELL_READ_PATTERN`.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import re2

from ._blocks import Message, text_of, tool_calls

MAX_PATTERN_CHARS = 1000
"""Longest read-tool pattern (a longer one is refused where the tool is built)."""

MAX_SUBJECT_CHARS = 4096
"""Longest command a pattern is tried on; a longer one reads no file."""

PATTERN_MAX_MEM = 256 * 1024
"""RE2's ``max_mem`` for a read-tool pattern: compiling stops once the program outgrows it.

RE2's default (8 MiB) let 43 characters of counted Unicode classes
(``(?:\\pL|\\pN|\\pP){1,200}\\pS{1,200}``) build a 376,000-instruction program in
1-2 s, with the interpreter lock held. Under 256 KiB the same pattern is
refused after about 10 ms; what stays is the parse of the pattern's text,
bounded by :data:`MAX_PATTERN_CHARS` (under 130 ms for 1,000 characters of
``\\pL``, the costliest measured)."""

MAX_PROGRAM_SIZE = 5000
"""Most RE2 instructions a read-tool pattern may compile to (the shell pattern: 288).

Matching falls back to RE2's NFA, linear in text times program, when its
DFA runs out of memory or a group must be extracted: the program's size
bounds what one match of a :data:`MAX_SUBJECT_CHARS` command may cost."""

PATTERN_CACHE_SIZE = 256
"""Distinct pattern texts whose compiled program (or refusal) is kept for reuse."""


class _Match(Protocol):
    def group(self, name: str) -> str | None: ...


class _Pattern(Protocol):
    groupindex: Mapping[str, int]
    programsize: int

    def fullmatch(self, text: str) -> _Match | None: ...


def _re2_options() -> object:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported to its sender, not on stderr
    options.max_mem = PATTERN_MAX_MEM
    return options


_RE2_OPTIONS = _re2_options()
_compiled: OrderedDict[str, _Pattern | str] = OrderedDict()
"""Pattern text -> its program, or the reason it was refused (the newest last)."""


def cached_pattern(source: str) -> _Pattern | None:
    """The compiled pattern of this text if it was compiled before, else None.

    Raises:
        ValueError: the text was refused before (the same reason).
    """
    found = _compiled.get(source)
    if found is None:
        return None
    _compiled.move_to_end(source)
    if isinstance(found, str):
        raise ValueError(found)
    return found


def compile_pattern(source: str) -> _Pattern:
    """A read tool's pattern, compiled by RE2, which matches in time linear in the text.

    RE2 never backtracks, so no pattern can make a match run for long; what
    it cannot do in linear time (backreferences, lookaround) it refuses. Its
    cost is bounded: at most :data:`MAX_PATTERN_CHARS` characters, compiled
    under :data:`PATTERN_MAX_MEM` to at most :data:`MAX_PROGRAM_SIZE`
    instructions. Each distinct text is compiled once (the last
    :data:`PATTERN_CACHE_SIZE` are kept, refusals too).

    Raises:
        ValueError: the pattern is longer than :data:`MAX_PATTERN_CHARS`, too
            large a program, does not compile, or has no group named ``path``.
    """
    found = cached_pattern(source)
    if found is not None:
        return found
    try:
        compiled = _compile(source)
    except ValueError as exc:
        _remember(source, str(exc))
        raise
    _remember(source, compiled)
    return compiled


def _remember(source: str, outcome: _Pattern | str) -> None:
    _compiled[source] = outcome
    while len(_compiled) > PATTERN_CACHE_SIZE:
        _compiled.popitem(last=False)


def _compile(source: str) -> _Pattern:
    if len(source) > MAX_PATTERN_CHARS:
        raise ValueError(
            f"a read tool's pattern has {len(source)} characters; at most {MAX_PATTERN_CHARS}"
        )
    try:
        compiled = cast(_Pattern, re2.compile(source, _RE2_OPTIONS))
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        if "pattern too large" in str(reason):
            raise ValueError(_too_large(f"more than {PATTERN_MAX_MEM // 1024} KiB")) from None
        raise ValueError(f"a read tool's pattern does not compile (RE2 syntax): {reason}") from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise ValueError(_too_large(f"{compiled.programsize} instructions"))
    if "path" not in compiled.groupindex:
        raise ValueError("a read tool's pattern needs a group named 'path'")
    return compiled


def _too_large(size: str) -> str:
    return (
        f"a read tool's pattern is too large: its RE2 program takes {size}; at most "
        f"{MAX_PROGRAM_SIZE} instructions (count fewer repetitions of large classes "
        "such as \\pL)"
    )


_PLAIN = r"""[^\s|;&<>()`$'"\\*?]"""
"""A character of a path word: no space, quote, shell operator, expansion or glob."""
_WORD = r"""(?:'|")?(?P<%s>""" + _PLAIN + r"""+)(?:'|")?"""
_COUNT = r"\s+(?:-n\s*|--lines=|-)"
_SED = r"""sed\s+-n\s+(?:'|")?(?P<%s>\d+)(?:,(?P<%s>\d+))?p(?:'|")?"""

SHELL_READ_PATTERN = (
    r"^\s*(?:cd\s+" + _WORD % "dir" + r"\s*&&\s*)?"
    r"(?:cat(?:\s+-n)?|nl(?:\s+-[a-z]+)*"
    r"|(?P<head>head)(?:" + _COUNT + r"(?P<first>\d+))?"
    r"|(?P<tail>tail)(?:" + _COUNT + r"(?:(?P<last>\d+)|\+(?P<since>\d+)))?"
    r"|" + _SED % ("from", "to") + r")"
    r"\s+" + _WORD % "path" + r"(?:\s*2>\s*/dev/null)?"
    r"(?:\s*\|\s*(?:(?P<then_head>head)(?:" + _COUNT + r"(?P<then_first>\d+))?"
    r"|" + _SED % ("then_from", "then_to") + r"))?\s*$"
)
"""A command that prints one file or a range of its lines (docs/DIALECTS.md, "File reads").

``cat`` (``-n``), ``nl`` (its flags), ``head``/``tail`` (``-n N``, ``-N``,
``--lines=N``, ``tail -n +N``) and ``sed -n 'A,Bp'`` of one path, after an
optional ``cd DIR &&``, with an optional ``2>/dev/null``; a whole-file print
may be piped into ``head`` or ``sed -n 'A,Bp'``, which makes it a range.
"""

_LISTED_WORD = r"""(?:-[nc]|--lines|--bytes)\s+\+?\d+|'[^'\n]+'|"[^"$`\\\n]+"|""" + _PLAIN + "+"
_SED_SCRIPT = r"""(?:'[^']*'|"[^"]*"|""" + _PLAIN + "+)"
_REDIRECT = r"\s+(?:[012]?>>?|&>)\s*(?:&[012]|" + _PLAIN + "+)"

LISTED_READ_PATTERN = (
    r"^\s*(?:[A-Za-z_][A-Za-z0-9_]*=" + _PLAIN + r"*\s+)*(?:" + _PLAIN + r"*/)?"
    r"(?:cat|nl|head|tail|less|more|bat"
    r"|sed\s+-[A-Za-hj-z]*n[A-Za-hj-z]*(?:\s+-e)?\s+" + _SED_SCRIPT + r")"
    r"(?P<words>(?:\s+(?:" + _LISTED_WORD + r"))+)(?:" + _REDIRECT + r")*\s*(?:\|.*)?$"
)
"""One command of a chain that prints files whole or in part, for the task ledger's files read.

What :data:`SHELL_READ_PATTERN` reads, widened: several paths, any flags,
``less``, ``more`` and ``bat``, any ``sed -n`` script, ``VAR=value`` and a
directory before the program, any redirection, anything piped after.
"""

_CHAIN = re.compile(r"&&|\|\||;|\n")
_LISTED_WORD_RE = re.compile(_LISTED_WORD)
_LISTED_READ = cast(_Pattern, re2.compile(LISTED_READ_PATTERN, _RE2_OPTIONS))


def shell_reads(command: str) -> tuple[str, ...]:
    """The paths a shell command prints whole or in part, in order, each once.

    Each command of a ``&&``, ``||`` or ``;`` chain (or of several lines) is
    matched by :data:`LISTED_READ_PATTERN`; a command the duplicate-read pass
    reads (:data:`SHELL_READ_PATTERN`) lists its path, as given (``cd DIR``
    is a command of its own here, not joined). Globs, expansions, ``-`` and
    ``/dev/null`` are no paths.
    """
    paths: list[str] = []
    for part in _CHAIN.split(command):
        if len(part) > MAX_SUBJECT_CHARS:
            continue  # no command that prints a few files is this long
        match = _LISTED_READ.fullmatch(part)
        if match is None:
            continue
        for word in _LISTED_WORD_RE.finditer(match.group("words") or ""):
            path = word.group().strip("'\"")
            if path.startswith("-") or path == "/dev/null" or path in paths:
                continue
            paths.append(path)
    return tuple(paths)


SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh"})
"""Shells whose ``-c``/``-lc`` argv (``["bash", "-lc", "cat a"]``) runs the command given."""

DEFAULT_LINES = 10
"""What ``head`` and ``tail`` print without a count."""


def shell_command(value: object) -> str | None:
    """The command line a shell tool's argument runs: the string itself, a shell's ``-c``
    script from an argv list, or an argv list joined as a shell would read it."""
    if isinstance(value, str):
        return value or None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return None
    shell = posixpath.basename(value[0])
    if shell in SHELLS and len(value) == 3 and value[1].startswith("-") and "c" in value[1]:
        return value[2] or None
    return shlex.join(value)


def _sed_or_head(match: _Match, prefix: str) -> str | None:
    """The lines a ``sed -n FROM,TOp`` or a ``head`` keeps, from the groups named with
    ``prefix`` (None: neither matched)."""
    start = match.group(f"{prefix}from")
    if start is not None:
        return f"lines={int(start)}-{int(match.group(f'{prefix}to') or start)}"
    if match.group(f"{prefix}head") is not None:
        return f"lines=1-{int(match.group(f'{prefix}first') or DEFAULT_LINES)}"
    return None


def _own_range(match: _Match) -> str | None:
    """The lines the command itself prints (None: the whole file)."""
    kept = _sed_or_head(match, "")
    if kept is not None:
        return kept
    if match.group("tail") is not None:
        since = match.group("since")
        return (
            f"lines={int(since)}-" if since else f"last={int(match.group('last') or DEFAULT_LINES)}"
        )
    return None


def _piped_range(match: _Match) -> str | None:
    """The lines a pipe into ``head`` or ``sed -n`` keeps (None: no such pipe)."""
    return _sed_or_head(match, "then_")


def shell_read_key(
    match: _Match, groups: Mapping[str, int], command: str, base: str | None
) -> str | None:
    """The key of a shell read: its path (under ``cd DIR`` or the call's ``workdir`` when
    relative), and for a partial read ``#`` and its range (``a.py#lines=1-20``).

    A pattern without the built-in one's range groups keys a command other
    than ``cat`` by the path and the whole command. None for a range of a
    range (``head a | sed -n 2,3p``), which is not followed.
    """
    path = match.group("path")
    if not path:
        return None
    for where in (match.group("dir") if "dir" in groups else None, base):
        if where and not path.startswith("/"):
            path = posixpath.join(where, path)
    if "then_from" not in groups:
        return path if command.strip().startswith("cat ") else f"{path}#{command.strip()}"
    own, piped = _own_range(match), _piped_range(match)
    if own is not None and piped is not None:
        return None
    part = own or piped
    return path if part is None else f"{path}#{part}"


@dataclass(frozen=True, slots=True)
class ReadTool:
    """One tool whose calls read a file.

    Attributes:
        name: the tool's name as the model calls it.
        arg: the argument that names the path (for a shell tool: the command).
        when: other arguments that must have these values (``command: view``).
        pattern: for a shell tool, a regular expression (RE2 syntax) the
            command must match in full; its group ``path`` is the path.
        compiled: ``pattern`` compiled (:func:`compile_pattern`); given when
            ``pattern`` is, else built from it.
    """

    name: str
    arg: str
    when: tuple[tuple[str, str], ...] = ()
    pattern: str | None = None
    compiled: _Pattern | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.pattern is not None and self.compiled is None:
            object.__setattr__(self, "compiled", compile_pattern(self.pattern))

    def _called(self, arguments: object) -> tuple[str, _Match | None] | None:
        """The call's path argument (a shell tool's command) and, for a shell tool, the
        pattern's match of it; None when the call reads no file."""
        if not isinstance(arguments, Mapping):
            return None
        value = arguments.get(self.arg)
        if self.compiled is not None:
            value = shell_command(value)
        if not isinstance(value, str) or not value:
            return None
        for name, wanted in self.when:
            if arguments.get(name) != wanted:
                return None
        if self.compiled is None:
            return value, None
        if len(value) > MAX_SUBJECT_CHARS:
            return None  # no command that prints one file is this long
        match = self.compiled.fullmatch(value)
        return None if match is None else (value, match)

    def path(self, arguments: object) -> str | None:
        """The path this call reads, as the call gives it (no ``cd`` or ``workdir`` joined),
        or None."""
        called = self._called(arguments)
        if called is None:
            return None
        value, match = called
        return value if match is None else (match.group("path") or None)

    def key(self, arguments: object) -> str | None:
        """What this call reads (calls with the same key read the same thing), or None."""
        called = self._called(arguments)
        if called is None or not isinstance(arguments, Mapping):
            return None
        value, match = called
        if self.compiled is not None and match is not None:
            base = arguments.get("workdir")
            return shell_read_key(
                match, self.compiled.groupindex, value, base if isinstance(base, str) else None
            )
        # Other arguments (a line range) make it another read of the same path.
        rest = {k: v for k, v in arguments.items() if k != self.arg and k not in dict(self.when)}
        if not rest:
            return value
        return f"{value}#{json.dumps(rest, sort_keys=True, default=repr)}"


SHELL_TOOLS: tuple[tuple[str, str], ...] = (
    ("Bash", "command"),  # Claude Code
    ("bash", "command"),  # Anthropic's bash tool
    ("exec_command", "cmd"),  # Codex
    ("shell", "command"),  # Codex's and OpenAI-style shell functions (argv lists too)
    ("shell", "cmd"),
    ("run_shell_command", "command"),  # Gemini CLI
    ("execute_bash", "command"),  # OpenHands
)
"""The shell tools whose command :data:`SHELL_READ_PATTERN` reads by default: (name, argument)."""

DEFAULT_READ_TOOLS: tuple[ReadTool, ...] = (
    ReadTool("read_file", "path"),
    ReadTool("Read", "file_path"),
    ReadTool("str_replace_based_edit_tool", "path", when=(("command", "view"),)),
    ReadTool("view", "path"),
    *(ReadTool(name, arg, pattern=SHELL_READ_PATTERN) for name, arg in SHELL_TOOLS),
)
"""The read tools known without configuration (docs/DIALECTS.md, "File reads")."""


class ReadRules:
    """The read tools of one task, by name."""

    __slots__ = ("_by_name", "tools")

    def __init__(self, tools: Iterable[ReadTool] = DEFAULT_READ_TOOLS) -> None:
        self.tools = tuple(tools)
        self._by_name: dict[str, list[ReadTool]] = {}
        for tool in self.tools:
            self._by_name.setdefault(tool.name, []).append(tool)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReadRules) and other.tools == self.tools

    def __hash__(self) -> int:
        return hash(self.tools)

    def extended(self, tools: Iterable[ReadTool]) -> ReadRules:
        """These rules plus ``tools``."""
        return ReadRules((*self.tools, *tools))

    def key(self, name: object, arguments: object) -> str | None:
        """What a call of tool ``name`` with ``arguments`` reads, or None when it reads no file."""
        if not isinstance(name, str):
            return None
        for tool in self._by_name.get(name, ()):
            found = tool.key(arguments)
            if found is not None:
                return found
        return None


DEFAULT_READ_RULES = ReadRules()


def read_tool_pattern(item: Mapping[str, Any]) -> str | None:
    """The pattern text a read tool's configuration form names (None: no pattern).

    The form is ``{"name": str, "arg": str, "when"?: {arg: value}, "pattern"?: str}``;
    ``pattern: "shell"`` stands for :data:`SHELL_READ_PATTERN`. Nothing is compiled.

    Raises:
        ValueError: the item does not have that form.
    """
    name = item.get("name")
    arg = item.get("arg")
    if not isinstance(name, str) or not name or not isinstance(arg, str) or not arg:
        raise ValueError("a read tool needs a non-empty 'name' and 'arg'")
    when = item.get("when", {})
    if not isinstance(when, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in when.items()
    ):
        raise ValueError("a read tool's 'when' must map argument names to strings")
    unknown = set(item) - {"name", "arg", "when", "pattern"}
    if unknown:
        raise ValueError(f"a read tool has unknown keys {sorted(unknown)}")
    pattern = item.get("pattern")
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise ValueError("a read tool's 'pattern' must be a string")
    return SHELL_READ_PATTERN if pattern == "shell" else pattern


def read_tool_from_config(item: Mapping[str, Any], compiled: _Pattern | None = None) -> ReadTool:
    """A :class:`ReadTool` from its configuration form (see :func:`read_tool_pattern`).

    ``compiled`` is the pattern already compiled (:func:`compile_pattern`), by
    a caller that compiles it when it chooses; without it, it is compiled here.

    Raises:
        ValueError: the item does not have that form, or its pattern is refused.
    """
    source = read_tool_pattern(item)
    when = item.get("when", {})
    return ReadTool(
        item["name"], item["arg"], tuple(sorted(when.items())), source, compiled=compiled
    )


def native_reads(
    messages: Sequence[Message], index: int, rules: ReadRules
) -> tuple[tuple[str, int], ...]:
    """The file reads that message ``index`` answers, as ``(key, block index)``.

    A read's result is a ``tool_result`` block with a text, answering a call
    of the message before that the rules count as a read.
    """
    message = messages[index]
    content = message.get("content")
    if index == 0 or message.get("role") != "user" or not isinstance(content, list):
        return ()
    calls: dict[str, tuple[object, object]] | None = None
    found: list[tuple[str, int]] = []
    for block_index, block in enumerate(content):
        if block.get("type") != "tool_result" or not text_of(block):
            continue
        if calls is None:
            calls = tool_calls(messages[index - 1])
        call = calls.get(block.get("tool_use_id", ""))
        if call is None:
            continue
        key = rules.key(*call)
        if key is not None:
            found.append((key, block_index))
    return tuple(found)
