"""The task ledger: what removed turns held, compact and written without a model.

One deterministic summariser (docs/SUMMARIES.md, "The task ledger"): from the
history in the internal form and the messages removed from the view, every
user instruction verbatim (repeated ones once, long ones capped), one line per
group of calls whose turn is gone (the tool, its key argument, ok or error,
the result's size), the files read and written (paths only). It has a budget
in tokens and says what it shortened to stay within it. ``condense``'s basic
summary is this ledger, with the assistant's conclusions when room is left.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from ._blocks import Block, Message
from ._reads import DEFAULT_READ_RULES, ReadRules, shell_reads

__all__ = [
    "Gone",
    "LedgerCall",
    "ledger_calls",
    "task_ledger",
    "typed_parts",
    "user_instructions",
]

INSTRUCTION_CAPS = (1000, 500, 250, 160)
"""Characters (spaces normalised) an instruction keeps, at each step of shortening.

The last keeps what "instructions kept" measures (docs/SUMMARIES.md: an
instruction's first 160 characters with spaces normalised).
"""
COUNTED, MERGED, LEFT_OUT = 2, 3, 4
"""The levels of a call group shown as its tool and a count (consecutive ones share a
line), counted in the one line of all such groups, and left out."""
KEY_CAP = 200
"""Characters of a call's key argument shown whole (a longer one: its beginning)."""
PROSE_CAP = 60
"""Characters shown of a key argument that is prose (a question, a description)."""
LONG_KEY_SHOWN = 160
"""Characters shown of a key argument over its cap (the rest cut, marked): as many as
identify a call in docs/COST.md's "calls visible" (a key argument's first 160
characters, spaces normalised), since a long command's beginning is what tells it apart."""
ERROR_CAP = 80
"""Characters of an error's first line shown on its call."""
FILES_SHORT = 20
"""Paths a files list keeps once shortened (the newest)."""
CONCLUSION_CAP = 600
"""Characters of an assistant's conclusion kept (a longer one: its first line, cut there)."""

_CLINE_TAGS = re.compile(r"<(task|feedback|user_message|answer)>\s*(.*?)\s*(?:</\1>|\Z)", re.DOTALL)
# Cline's result header (SPEC.md §6): ``[tool for 'arg'] Result:`` or ``[tool] Result:``;
# ``search_files`` adds `` in 'pattern'``. The argument may hold quotes: the lazy match
# stops at the first closing ``'] Result:``.
_CLINE_HEADER = re.compile(
    r"\s*\[([A-Za-z0-9_.:-]+)(?: for '(.*?)'(?: in '(.*?)')?)?\] Result:", re.DOTALL
)
_ERROR_LINE = re.compile(
    r"\s*(?:<tool_use_error>|<error>|\[error\]|error\b|fatal\b|traceback\b|exception\b"
    r"|exit code:? *[1-9]|command failed|the tool execution failed|\w*(?:error|exception):)",
    re.IGNORECASE,
)
_MARKUP = re.compile(r"</?[A-Za-z_][\w-]*(?:\s[^>]*)?>")

_PATH_KEYS = (
    "file_path",
    "path",
    "filePath",
    "notebook_path",
    "absolute_path",
    "target_file",
    "file",
    "filename",
)
_COMMAND_KEYS = ("command", "cmd")
_SEARCH_KEYS = ("pattern", "regex", "query", "q")
# A command or a search says more than the folder it runs in; a path comes next.
_KEY_ORDER = (*_COMMAND_KEYS, *_SEARCH_KEYS, *_PATH_KEYS, "url", "glob", "paths", "description")
# What a key argument given under one of these names is: not prose.
_KEYED = frozenset({"cmd", "patch", *_SEARCH_KEYS, *_PATH_KEYS, "url", "glob", "paths"})
# Cline's tools whose header names a path, a command, a pattern or a URL.
_CLINE_KEYED = frozenset(
    {
        "read_file",
        "write_to_file",
        "replace_in_file",
        "list_files",
        "list_code_definition_names",
        "search_files",
        "execute_command",
        "web_fetch",
        "browser_action",
        "use_mcp_tool",
        "access_mcp_resource",
    }
)
_EDITOR_KEY_ORDER = (*_PATH_KEYS, *_COMMAND_KEYS)
_READ_TOOLS = frozenset({"read_file", "Read", "view", "read", "open_file", "ReadFile"})
_WRITE_TOOLS = frozenset(
    {
        "write_to_file",
        "replace_in_file",
        "write_file",
        "Write",
        "Edit",
        "MultiEdit",
        "NotebookEdit",
        "edit_file",
        "create_file",
        "replace",
        "str_replace",
        "insert",
        "edit",
        "write",
        "apply_patch",
        "apply_diff",
    }
)
_EDITORS = frozenset({"str_replace_based_edit_tool", "str_replace_editor"})
_EDITOR_WRITES = frozenset({"create", "str_replace", "insert", "undo_edit"})
_PATCH_FILE = re.compile(r"^\*\*\* (?:Update|Add|Delete) File: (.+)$", re.MULTILINE)


# User instructions --------------------------------------------------------------


def _is_cline_task(messages: Sequence[Message]) -> bool:
    """Whether the history is a Cline task: its first message opens with ``<task>``."""
    return bool(messages) and any("<task>" in text for text in _texts(messages[0]))


def _texts(message: Message) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        block["text"]
        for block in content
        if block.get("type") == "text" and isinstance(block.get("text"), str)
    ]


def user_instructions(message: Message, cline: bool) -> list[str]:
    """What a person typed in ``message``: docs/COST.md's rule ("Instructions kept").

    The one definition the ledger lists and the strategies bench measures. In
    a Cline task (``cline``), the text inside ``<task>``, ``<feedback>``,
    ``<user_message>`` and ``<answer>`` (wherever it stands, a tool result's
    text too) and nothing else: tool results, environment details and Cline's
    reminders are not typed by anyone. Otherwise every text of a user message
    that is not a tool result and not system text (text that opens with
    ``<``): a bracketed note such as ``[Request interrupted by user]`` or an
    ``[attached document: ...]`` counts, as the log holds it.

    Args:
        message: one message of the history (the internal form).
        cline: whether the history is a Cline task.

    Returns:
        The instructions, stripped, in order (none for an assistant message).
    """
    if message.get("role") != "user":
        return []
    found: list[str] = []
    for text in _texts(message):
        if cline:
            found.extend(
                match.group(2) for match in _CLINE_TAGS.finditer(text) if match.group(2).strip()
            )
            continue
        stripped = text.strip()
        if stripped and not stripped.startswith("<"):
            found.append(stripped)
    return found


def typed_parts(text: str) -> list[str]:
    """The parts of a Cline text that a person typed, each with its tags (``<answer>...
    </answer>``): what a stub of that text keeps, so that masking a result never masks
    what :func:`user_instructions` counts as typed in it."""
    return [
        match.group(0).strip() for match in _CLINE_TAGS.finditer(text) if match.group(2).strip()
    ]


def _normalised(text: str) -> str:
    return " ".join(text.split())


def _capped(text: str, flat: str, cap: int) -> str:
    """``text`` whole when ``flat``, its normalised form, has at most ``cap`` characters;
    else that form's first ``cap`` characters and how many were cut."""
    if len(flat) <= cap:
        return text
    return f"{flat[:cap]} [… {len(flat) - cap:,} more characters cut]"


# Calls ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerCall:
    """One call whose turn is gone.

    Attributes:
        index: the message that holds it (the call, or a Cline result header).
        tool: the tool's name.
        key: its key argument (a path, command, pattern, query), or None.
        error: the first line of its result when the result is an error, else None.
        answered: whether a result answers it.
        size: the result's characters.
        reads: the paths it read (a read tool, or a shell that prints files).
        writes: the paths it wrote.
        prose: whether the key argument is prose (a question, a task's description)
            rather than a path, a command, a pattern or a query: shown shorter.
    """

    index: int
    tool: str
    key: str | None
    error: str | None
    answered: bool
    size: int
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    prose: bool = False


def _result_text(block: Block) -> tuple[str, int]:
    """A tool result's text (its text parts joined) and its size in characters."""
    content = block.get("content")
    if isinstance(content, str):
        return content, len(content)
    if not isinstance(content, list):
        return "", 0
    texts = [
        item["text"]
        for item in content
        if isinstance(item, dict)
        and item.get("type") == "text"
        and isinstance(item.get("text"), str)
    ]
    text = "\n".join(texts)
    return text, len(text)


def _error_line(text: str) -> str | None:
    """The first line of a result that reports an error, else None."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    if not line or _ERROR_LINE.match(line) is None:
        return None
    line = _MARKUP.sub("", line).strip() or line
    return line if len(line) <= ERROR_CAP else line[: ERROR_CAP - 1] + "…"


def _key_argument(tool: str, arguments: object) -> tuple[str | None, str | None]:
    """A call's key argument and the name it was given under (``cmd`` for a command)."""
    if isinstance(arguments, str):
        files = _PATCH_FILE.findall(arguments)
        if files:
            return ", ".join(path.strip() for path in files), "patch"
        line = next((part.strip() for part in arguments.splitlines() if part.strip()), "")
        return (line or None), None
    if not isinstance(arguments, dict):
        return None, None
    # An editor's ``command`` is its action (``view``, ``create``): its path is the key.
    for name in _EDITOR_KEY_ORDER if tool in _EDITORS else _KEY_ORDER:
        value = arguments.get(name)
        if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
            # A shell given as argv (``["bash", "-lc", "cat x"]``): the script is the command.
            if name in _COMMAND_KEYS and len(value) >= 3 and value[-2] in ("-c", "-lc"):
                return value[-1], "cmd"
            return " ".join(value), ("cmd" if name in _COMMAND_KEYS else name)
        if isinstance(value, str) and value.strip():
            return value, ("cmd" if name in _COMMAND_KEYS else name)
    patch = arguments.get("input") or arguments.get("patch")
    if isinstance(patch, str):
        files = _PATCH_FILE.findall(patch)
        if files:
            return ", ".join(path.strip() for path in files), "patch"
    for name, value in arguments.items():
        if isinstance(value, str) and value.strip() and len(value) <= KEY_CAP:
            return value, str(name)
    return None, None


def _rule_read(rules: ReadRules, tool: str, arguments: object) -> str | None:
    """The path a configured read tool reads with ``arguments``, or None."""
    for rule in rules.tools:
        if rule.name == tool:
            path = rule.path(arguments)
            if path is not None:
                return path
    return None


def _files(
    tool: str, arguments: object, key: str | None, given_as: str | None, rules: ReadRules
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The paths a call reads and writes."""
    ruled = _rule_read(rules, tool, arguments)
    if ruled is not None:
        return (ruled,), ()
    if key is None:
        return (), ()
    if given_as == "cmd":
        return shell_reads(key), ()
    if given_as == "patch":
        return (), tuple(path.strip() for path in key.split(", "))
    if given_as not in _PATH_KEYS or "\n" in key:
        return (), ()
    if tool in _EDITORS and isinstance(arguments, dict):
        command = arguments.get("command")
        if command == "view":
            return (key,), ()
        return ((), (key,)) if command in _EDITOR_WRITES else ((), ())
    if tool in _READ_TOOLS:
        return (key,), ()
    if tool in _WRITE_TOOLS:
        return (), (key,)
    return (), ()


def _results(messages: Sequence[Message]) -> dict[str, Block]:
    """Every tool result of the history, by the id of the call it answers."""
    found: dict[str, Block] = {}
    for message in messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str):
                found.setdefault(block["tool_use_id"], block)
    return found


def _has_header(message: Message) -> bool:
    return any(_CLINE_HEADER.match(text) is not None for text in _texts(message))


def ledger_calls(
    messages: Sequence[Message], gone: Sequence[int], rules: ReadRules = DEFAULT_READ_RULES
) -> list[LedgerCall]:
    """The calls of the ``gone`` messages, in order.

    A native call is the ``tool_use`` block of a gone assistant message, with
    the ``tool_result`` that answers it; a Cline call is the result header of
    a gone user message (``[read_file for 'a.py'] Result:``), which names it.
    A ``tool_use`` answered only by such a header is counted once, by its
    header; calls Cline did not run (``Tool [x] was not executed``) are not
    calls.
    """
    results: dict[str, Block] | None = None
    calls: list[LedgerCall] = []
    for index in gone:
        message = messages[index]
        content = message.get("content")
        if message.get("role") == "user":
            for text in _texts(message):
                header = _CLINE_HEADER.match(text)
                if header is None:
                    continue
                tool, key = header.group(1), header.group(2)
                body = text[header.end() :]
                error = _error_line(body)
                reads: tuple[str, ...] = ()
                writes: tuple[str, ...] = ()
                if error is None and key is not None:
                    if tool == "read_file":
                        reads = (key,)
                    elif tool in _WRITE_TOOLS:
                        writes = (key,)
                    elif tool == "execute_command":
                        reads = shell_reads(key)
                size = len(body.strip())
                prose = tool not in _CLINE_KEYED
                call = LedgerCall(index, tool, key, error, True, size, reads, writes, prose)
                calls.append(call)
            continue
        if not isinstance(content, list):
            continue
        for block in content:
            if block.get("type") != "tool_use":
                continue
            if results is None:
                results = _results(messages)
            tool = str(block.get("name") or "?")
            arguments = block.get("input")
            key, given_as = _key_argument(tool, arguments)
            result = results.get(str(block.get("id")))
            if result is None:
                after = messages[index + 1] if index + 1 < len(messages) else None
                if after is not None and _has_header(after):
                    continue  # answered by a Cline header: counted there
                prose = given_as not in _KEYED
                calls.append(LedgerCall(index, tool, key, None, False, 0, prose=prose))
                continue
            text, size = _result_text(result)
            error = "error" if result.get("_key") == "error" else None
            error = _error_line(text) or error
            reads, writes = ((), ()) if error else _files(tool, arguments, key, given_as, rules)
            prose = given_as not in _KEYED
            calls.append(LedgerCall(index, tool, key, error, True, size, reads, writes, prose))
    return calls


# Rendering under a budget ----------------------------------------------------------


def _size(chars: int) -> str:
    if chars < 1000:
        return str(chars)
    if chars < 10_000:
        return f"{chars / 1000:.1f}k"
    return f"{round(chars / 1000)}k"


def _key_text(call: LedgerCall) -> str:
    key = call.key
    if key is None:
        return ""
    key = " ".join(key.split())
    cap = PROSE_CAP if call.prose else KEY_CAP
    if len(key) <= cap:
        return key
    return key[: min(LONG_KEY_SHOWN, cap)] + "…"


def _call_full(call: LedgerCall) -> str:
    key = _key_text(call)
    head = f"{key} " if key else ""
    if not call.answered:
        return f"{head}no result"
    if call.error is not None:
        detail = "" if call.error == "error" else f" ({call.error})"
        return f"{head}error {_size(call.size)}{detail}"
    return f"{head}ok {_size(call.size)}"


def _compact_forms(groups: Sequence[tuple[LedgerCall, ...]]) -> list[str]:
    """Each group's compact line: its distinct key arguments once each (`` (xN)`` when
    repeated), marked only where they failed or got no result, without sizes.

    A key that a later group of the same tool also shows is left to that line
    (the oldest lines are shortened first, so the later one still shows it),
    unless it failed here. Calls without a key argument are counted.
    """
    later: dict[str, set[str]] = {}
    forms: list[str] = []
    for group in reversed(groups):
        keys: dict[str, list[LedgerCall]] = {}
        bare = 0
        for call in group:
            key = _key_text(call)
            if key:
                keys.setdefault(key, []).append(call)
            else:
                bare += 1
        shown = later.setdefault(group[0].tool, set())
        parts: list[str] = []
        for key, same in keys.items():
            failed = any(call.error is not None for call in same)
            if key in shown and not failed:
                continue
            times = f" (x{len(same)})" if len(same) > 1 else ""
            mark = " error" if failed else ""
            if not any(call.answered for call in same):
                mark = " no result"
            parts.append(f"{key}{times}{mark}")
        shown.update(keys)
        if bare:
            parts.append(f"{bare} without argument" if parts else str(bare))
        if not parts:
            parts.append(f"{len(group)}, arguments on a later line")
        forms.append(f"- {group[0].tool}: " + "; ".join(parts))
    return forms[::-1]


def _counted(calls: Sequence[LedgerCall]) -> str:
    errors = sum(call.error is not None for call in calls)
    unanswered = sum(not call.answered for call in calls)
    notes = [f"{errors} error{'s' if errors != 1 else ''}"] if errors else []
    if unanswered:
        notes.append(f"{unanswered} without a result")
    return f"{len(calls)}" + (f" ({', '.join(notes)})" if notes else "")


@dataclass(slots=True)
class _Item:
    """One line of the ledger and its shorter forms (None: left out)."""

    kind: str
    order: int
    forms: list[str | None]
    level: int = 0
    calls: tuple[LedgerCall, ...] = ()
    paths: tuple[str, ...] = ()

    @property
    def text(self) -> str | None:
        return self.forms[self.level]


def _group(calls: Sequence[LedgerCall]) -> list[tuple[LedgerCall, ...]]:
    """Consecutive calls of one tool, together."""
    groups: list[list[LedgerCall]] = []
    for call in calls:
        if groups and groups[-1][0].tool == call.tool:
            groups[-1].append(call)
        else:
            groups.append([call])
    return [tuple(group) for group in groups]


def _named(call: LedgerCall) -> tuple[str, ...]:
    """The paths ``call`` reads or writes that its call line shows (in its key argument)."""
    key = _key_text(call)
    return tuple(path for path in (*call.reads, *call.writes) if path in key)


def _unique(paths: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(path for path in paths if path))


def _conclusions(messages: Sequence[Message], gone: Sequence[int], cline: bool) -> list[str]:
    """Each turn's last assistant text among the gone messages, in order."""
    finals: list[str] = []
    last: str | None = None
    for index in gone:
        message = messages[index]
        if message.get("role") == "user":
            if user_instructions(message, cline) and last is not None:
                finals.append(last)
                last = None
            continue
        texts = [text for text in _texts(message) if text.strip()]
        if texts:
            last = texts[-1].strip()
    if last is not None:
        finals.append(last)
    out: list[str] = []
    for final in finals:
        if len(final) > CONCLUSION_CAP:
            line = next((part.strip() for part in final.splitlines() if part.strip()), "")
            final = line if len(line) <= CONCLUSION_CAP else line[: CONCLUSION_CAP - 1] + "…"
        out.append(final)
    return out


Gone = int | range | Sequence[int]
"""Removed messages: an index, a ``range``, or an inclusive pair ``(start, end)`` (the form
of the deleted range and of each range of a deleted set)."""


def _gone_indices(gone: Iterable[Gone], length: int) -> list[int]:
    """The removed indices, ascending, within the history.

    Raises:
        ValueError: an item that is not an index, a range or an inclusive pair.
    """
    found: set[int] = set()
    for item in gone:
        if isinstance(item, range):
            found.update(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            found.add(item)
        elif (
            isinstance(item, Sequence)
            and len(item) == 2
            and all(isinstance(bound, int) and not isinstance(bound, bool) for bound in item)
        ):
            found.update(range(item[0], item[1] + 1))
        else:
            raise ValueError(f"removed messages are indices, ranges or (start, end): {item!r}")
    return sorted(index for index in found if 0 <= index < length)


def task_ledger(
    messages: Sequence[Message],
    gone: Iterable[Gone],
    budget: int,
    count: Callable[[str], int],
    reads: ReadRules | None = None,
    *,
    conclusions: bool = False,
) -> str:
    """The ledger of the ``gone`` messages of a history, at most ``budget`` tokens.

    The same input gives the same text. Its sections (docs/SUMMARIES.md):
    every user instruction verbatim, oldest first (one that repeats an earlier
    one word for word is listed once, with how many times it was said; one
    over 1,000 characters is cut there, saying how many were cut); the calls
    whose turn is gone, consecutive calls of one tool on one line (each with
    its key argument, ok or error with the error's first line, and the
    result's size in characters); the files read and written, paths only
    (how many, and those no call line shown names: a path is written once);
    and, with ``conclusions``, each turn's last assistant text.

    Over the budget it shortens, in this order, and says what it shortened
    (how many of each): the conclusions (oldest first); the oldest calls to
    their distinct key arguments, each once (one a later line of the same
    tool shows left to that line); instructions to 500 characters (longest
    first); the oldest calls to their tool and a count (consecutive groups
    on one line); the files lists to their newest 20 paths; instructions to
    250, then 160 characters (longest first); the oldest calls into one
    count per tool; the files lists; the calls (oldest first); only then the
    oldest instructions. When
    even that is over, the text is that note alone (or empty).

    Args:
        messages: the task's history (the internal form, any dialect's mapped
            messages).
        gone: the messages removed from the view (any set of them): indices,
            ``range`` objects and inclusive pairs ``(start, end)``, as the
            deleted range and a deleted set hold them.
        budget: tokens the ledger may take.
        count: tokens of a text.
        reads: the task's read tools (a native dialect's), besides the usual
            ones; None for the defaults.
        conclusions: add each turn's last assistant text (``condense``'s
            basic summary), in what room is left.

    Returns:
        The ledger, or an empty text when the gone messages hold nothing to list.

    Raises:
        ValueError: ``gone`` holds something else.
    """
    rules = DEFAULT_READ_RULES if reads is None else reads
    indices = _gone_indices(gone, len(messages))
    cline = _is_cline_task(messages)
    said: dict[str, list[str]] = {}
    for index in indices:
        for text in user_instructions(messages[index], cline):
            said.setdefault(_normalised(text), []).append(text)
    calls = ledger_calls(messages, indices, rules)
    items: list[_Item] = []
    for order, (flat, texts) in enumerate(said.items()):
        times = f"(said {len(texts)} times) " if len(texts) > 1 else ""
        forms: list[str | None] = [
            f"- {times}{_capped(texts[0], flat, cap)}" for cap in INSTRUCTION_CAPS
        ]
        items.append(_Item("instruction", order, [*forms, None]))
    groups = _group(calls)
    for order, (group, compact) in enumerate(zip(groups, _compact_forms(groups), strict=True)):
        tool = group[0].tool
        full = f"- {tool}: " + "; ".join(_call_full(call) for call in group)
        counted = f"{tool} {_counted(group)}"
        items.append(_Item("calls", order, [full, compact, counted, None, None], calls=group))
    read = _unique(path for call in calls for path in call.reads)
    written = _unique(path for call in calls for path in call.writes)
    if read:
        items.append(_Item("files", 0, ["Files read", "Files read", None], paths=tuple(read)))
    if written:
        title = "Files written"
        items.append(_Item("files", 1, [title, title, None], paths=tuple(written)))
    if conclusions:
        for order, final in enumerate(_conclusions(messages, indices, cline)):
            items.append(_Item("conclusion", order, [f"- {final}", None]))
    if not items:
        return ""
    return _Shortener(items, budget, count).text()


class _Shortener:
    """The ledger's lines, shortened step by step until they fit the budget.

    What each step changes is kept as it goes (the lines' tokens, what the
    note will say), so a step costs the same however long the ledger is.
    """

    def __init__(self, items: list[_Item], budget: int, count: Callable[[str], int]) -> None:
        self.budget = budget
        self.count = count
        self.costs: dict[str, int] = {}
        self.kinds: dict[str, list[_Item]] = {}
        for item in items:
            self.kinds.setdefault(item.kind, []).append(item)
        self.items = items
        self.start = sum(self.cost(item.text) for item in items if item.kind != "files")
        # Per call group, the paths its line names; per path, the files lists holding it.
        self.named = {id(item): [p for c in item.calls for p in _named(c)] for item in items}
        self.lists: dict[str, list[int]] = {}
        for place, item in enumerate(self.of("files")):
            for path in item.paths:
                self.lists.setdefault(path, []).append(place)
        self.reset()

    def reset(self) -> None:
        """Every line back to its whole form, nothing shortened."""
        for item in self.items:
            item.level = 0
        self.lines = self.start
        # What the note says: instructions per cap and left out, calls per level,
        # the conclusions left out, the calls counted in one line.
        self.capped: dict[int, int] = {}
        self.dropped = 0
        self.calls: dict[int, int] = {}
        self.finals = 0
        self.merged: dict[str, int] = {}
        self.merged_errors = 0
        # How many call lines shown whole name each path (the files lists leave those out),
        # and the characters of each files list's paths that no line names.
        self.shown: dict[str, int] = {}
        self.unshown = [sum(len(path) + 2 for path in item.paths) for item in self.of("files")]
        for item in self.of("calls"):
            self.show(item, 1)

    def show(self, item: _Item, step: int) -> None:
        """Count the paths ``item``'s calls name on their line (``step`` 1), or uncount them."""
        for path in self.named[id(item)]:
            before = self.shown.get(path, 0)
            self.shown[path] = before + step
            if (before == 0) != (before + step == 0):  # named on no line before, or after
                for place in self.lists.get(path, ()):
                    self.unshown[place] -= step * (len(path) + 2)

    def files_line(self, item: _Item) -> str | None:
        """A files list: its paths not named on a call line, the newest 20 once shortened."""
        if item.level == 2:
            return None
        paths = [path for path in item.paths if not self.shown.get(path)]
        title = item.forms[0]
        if not paths:
            return f"{title}: {len(item.paths)}, each named on a call line above"
        head = (
            f"{title}: "
            if len(paths) == len(item.paths)
            else (f"{title}: {len(item.paths)}, those not named on a call line above: ")
        )
        if len(paths) > FILES_SHORT and item.level == 1:
            left = len(paths) - FILES_SHORT
            head = head.replace(f"{title}: ", f"{title} ({left} earlier left out): ", 1)
            paths = paths[-FILES_SHORT:]
        return head + ", ".join(paths)

    def cost(self, line: str | None) -> int:
        if line is None:
            return 0
        found = self.costs.get(line)
        if found is None:
            found = self.costs[line] = self.count(line) + 1
        return found

    def of(self, kind: str) -> list[_Item]:
        return self.kinds.get(kind, [])

    def render(self) -> str:
        lines: list[str] = []
        instructions = [i.text for i in self.of("instruction") if i.text is not None]
        if instructions:
            lines.append("User instructions, verbatim, oldest first:")
            lines.extend(instructions)
        groups = [item for item in self.of("calls") if item.level < LEFT_OUT]
        if groups:
            lines.append("Calls (tool: key argument, ok or error, result size in characters):")
            if self.merged:
                lines.append(self.merged_line())
            run: list[str] = []  # consecutive groups counted per tool share a line
            for item in groups:
                if item.level == COUNTED:
                    run.append(item.text or "")
                    continue
                if run:
                    lines.append("- " + ", ".join(run))
                    run = []
                if item.text is not None:
                    lines.append(item.text)
            if run:
                lines.append("- " + ", ".join(run))
        for item in self.of("files"):
            line = self.files_line(item)
            if line is not None:
                lines.append(line)
        finals = [item.text for item in self.of("conclusion") if item.text is not None]
        if finals:
            lines.append("Assistant, at the end of each turn:")
            lines.extend(finals)
        note = self.note()
        if note:
            lines.append(note)
        return "\n".join(lines)

    def merged_line(self) -> str:
        """The one line of the calls counted together: how many of each tool."""
        tools = ", ".join(f"{tool} {number}" for tool, number in self.merged.items())
        errors = self.merged_errors
        tail = f"; {_plural(errors, 'error')}" if errors else ""
        return f"- {sum(self.merged.values())} calls: {tools}{tail}"

    def note(self) -> str:
        """What the shortening did (empty when nothing was)."""
        parts = [
            f"{_plural(number, 'instruction')} cut to {cap} characters"
            for cap, number in sorted(self.capped.items(), reverse=True)
            if number
        ]
        if self.dropped:
            parts.append(f"the {_plural(self.dropped, 'oldest instruction')} left out")
        for level, what in (
            (1, "as their distinct key arguments"),
            (COUNTED, "counted per tool"),
            (MERGED, "counted in one line"),
            (LEFT_OUT, "left out"),
        ):
            if self.calls.get(level):
                parts.append(f"{_plural(self.calls[level], 'call')} {what}")
        for item in self.of("files"):
            if item.level == 2:
                parts.append(f"{item.forms[0]} left out")
            elif item.level == 1 and sum(not self.shown.get(p) for p in item.paths) > FILES_SHORT:
                parts.append(f"{item.forms[0]} cut to the newest {FILES_SHORT}")
        if self.finals:
            parts.append(f"{_plural(self.finals, 'assistant conclusion')} left out")
        if not parts:
            return ""
        return f"Shortened to fit {self.budget:,} tokens: " + "; ".join(parts) + "."

    def estimate(self) -> int:
        """The ledger's tokens, from its lines' (headers taken as 20 tokens each; the note,
        the files lists and the line of calls counted together, which change with the
        steps, by their length: about 3 characters a token)."""
        total = self.lines + 3 * 20
        for item, chars in zip(self.of("files"), self.unshown, strict=True):
            if item.level < 2:
                total += 20 + min(chars, 60 * FILES_SHORT if item.level else chars) // 3
        if self.merged:
            total += len(self.merged_line()) // 3 + 1
        return total + len(self.note()) // 3 + 1

    def steps(self) -> Iterator[tuple[_Item, int]]:
        """Each shortening, in the order the docstring of :func:`task_ledger` gives."""
        yield from ((item, 1) for item in self.of("conclusion"))
        calls = self.of("calls")
        yield from ((item, 1) for item in calls)
        yield from ((item, 1) for item in self.longest(self.of("instruction")))
        yield from ((item, COUNTED) for item in calls)
        yield from ((item, 1) for item in self.of("files"))
        yield from ((item, 2) for item in self.longest(self.of("instruction")))
        yield from ((item, 3) for item in self.longest(self.of("instruction")))
        yield from ((item, MERGED) for item in calls)
        yield from ((item, 2) for item in self.of("files"))
        yield from ((item, LEFT_OUT) for item in calls)
        yield from ((item, 4) for item in self.of("instruction"))

    @staticmethod
    def longest(items: list[_Item]) -> list[_Item]:
        return sorted(items, key=lambda item: (-len(item.text or ""), item.order))

    def apply(self, item: _Item, level: int) -> None:
        """Take ``item`` to ``level`` (never back), keeping the totals and the note's counts."""
        if level <= item.level:
            return
        if item.kind == "files":
            item.level = level
            return
        before, shortened = item.text, item.level > 0 and item.text != item.forms[0]
        self.lines -= self.cost(before)
        if item.kind == "calls" and item.level < COUNTED <= level:
            self.show(item, -1)  # its paths are no longer on its line
        if item.kind == "instruction":
            if shortened:
                self.capped[INSTRUCTION_CAPS[item.level]] -= 1
        elif item.kind == "calls":
            if shortened:
                self.calls[item.level] -= len(item.calls)
            if item.level == MERGED:
                for call in item.calls:
                    self.merged[call.tool] -= 1
                    if not self.merged[call.tool]:
                        del self.merged[call.tool]
                self.merged_errors -= sum(call.error is not None for call in item.calls)
        item.level = level
        self.lines += self.cost(item.text)
        if item.text == item.forms[0]:
            return  # the same text at this level: nothing to say
        if item.kind == "instruction":
            if item.text is None:
                self.dropped += 1
            else:
                cap = INSTRUCTION_CAPS[level]
                self.capped[cap] = self.capped.get(cap, 0) + 1
        elif item.kind == "calls":
            self.calls[level] = self.calls.get(level, 0) + len(item.calls)
            if level == MERGED:
                for call in item.calls:
                    self.merged[call.tool] = self.merged.get(call.tool, 0) + 1
                self.merged_errors += sum(call.error is not None for call in item.calls)
        elif item.kind == "conclusion":
            self.finals += 1

    def text(self) -> str:
        """The ledger within the budget, shortened by the fewest steps that make it fit."""
        text = self.render()
        # A text the estimate puts at twice the budget is not counted whole (a count
        # is linear in its length): it is over.
        exact = self.count(text) if self.estimate() <= 2 * self.budget else None
        steps = self.steps()
        done: list[tuple[_Item, int]] = []
        over = 0  # the most steps known to leave the text over the budget
        while exact is None or exact > self.budget:
            over = len(done)
            # Steps by the estimate (scaled to the last exact count), then one exact count.
            scale = 1.0 if exact is None else exact / max(self.estimate(), 1)
            step = next(steps, None)
            if step is None:
                note = self.note()
                return note if self.count(note) <= self.budget else ""
            self.apply(*step)
            done.append(step)
            while self.estimate() * scale > self.budget:
                step = next(steps, None)
                if step is None:
                    break
                self.apply(*step)
                done.append(step)
            text = self.render()
            exact = self.count(text)
        # The estimate may have taken more steps than needed: the fewest that fit, by
        # bisection between a count known over and one known within.
        fits = len(done)
        # (Within 3% of the budget is near enough: each probe counts the whole text.)
        while fits - over > 1 and exact < self.budget * 0.97:
            middle = (over + fits) // 2
            self.reset()
            for step in done[:middle]:
                self.apply(*step)
            attempt = self.render()
            tokens = self.count(attempt)
            if tokens <= self.budget:
                fits, text, exact = middle, attempt, tokens
            else:
                over = middle
        return text


def _plural(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
