"""The providers' rules for a conversation (docs/DIALECTS.md), as the one checker of the tests.

:func:`problems` lists what a provider would refuse in a dialect's message list. The
property and wire tests hold every view to it (:data:`CHECKS`, a view is a history the
caller continues: ``open_end``, calls in its newest message are the caller's to answer),
and the fake provider refuses a request by it (a request is answered as it stands: every
call wants its result). The rules, with the provider documentation that states them:

- openai-chat: the roles of the API reference; an assistant message has ``content``
  ("required unless ``tool_calls``") or calls; its calls are answered by one ``tool``
  message each right after it, before any other message (a kept-out one included);
  a ``tool`` message answers such a call.
- anthropic: roles ``user`` and ``assistant``; the first turn is the user's;
  consecutive messages of one role are one turn (the Messages API reference:
  "Consecutive user or assistant turns in your request will be combined into a single
  turn"); a turn's ``tool_use`` blocks are answered by the next user turn, whose
  ``tool_result`` blocks come first and answer exactly them; no empty text block.
- openai-responses: every ``*_call_output`` item answers a ``*_call`` item before it,
  once; every call has its output.
- gemini: a model content's function calls are answered by the next content, a user
  one, with one response each; responses only there; no content without parts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Message = dict[str, Any]

KEPT_OUT = ("system", "developer")
CHAT_ROLES = (*KEPT_OUT, "user", "assistant", "tool", "function")


def chat(messages: Sequence[Message], *, open_end: bool) -> list[str]:
    """OpenAI Chat Completions ``messages``."""
    problems: list[str] = []
    open_ids: set[str] = set()
    between = ""  # where a kept-out message came while calls were open
    for index, message in enumerate(messages):
        role = message.get("role")
        where = f"messages[{index}]"
        if role not in CHAT_ROLES:
            problems.append(f"{where}: role {role!r}")
            continue
        if role == "tool":
            if between:
                problems.append(f"{between}: a kept-out message stands between calls and results")
            call = message.get("tool_call_id")
            if call not in open_ids:
                problems.append(
                    f"{where}: a tool result for {call!r} does not answer the message before"
                )
            open_ids.discard(call)
            continue
        if open_ids and role in KEPT_OUT:
            between = where  # fine only if nothing but kept-out messages follows
            continue
        if open_ids:
            problems.append(
                f"{between or where}: calls {sorted(open_ids)} are not answered before this"
            )
        open_ids, between = set(), ""
        if role == "assistant":
            calls = message.get("tool_calls") or []
            if message.get("content") is None and not calls:
                problems.append(f"{where}: an assistant message with neither content nor calls")
            open_ids = {call["id"] for call in calls}
    if open_ids and not open_end:
        problems.append(f"calls {sorted(open_ids)} have no result at the end")
    return problems


def _turns(messages: Sequence[Message]) -> list[Message]:
    """Consecutive messages of one role as one turn of blocks (what the provider makes of them)."""
    turns: list[Message] = []
    for message in messages:
        content: Any = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        if turns and turns[-1]["role"] == message.get("role"):
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": message.get("role"), "content": blocks})
    return turns


def _calls(blocks: Sequence[Message]) -> list[str]:
    return [b["id"] for b in blocks if b.get("type") == "tool_use"]


def anthropic(messages: Sequence[Message], *, open_end: bool) -> list[str]:
    """Anthropic Messages ``messages``."""
    problems: list[str] = []
    turns = _turns(messages)
    if turns and turns[0]["role"] != "user":
        problems.append("turn 0: the first turn must be the user's")
    for index, turn in enumerate(turns):
        where = f"turn {index}"
        if turn["role"] not in ("user", "assistant"):
            problems.append(f"{where}: role {turn['role']!r}")
        blocks = turn["content"]
        if any(b.get("type") == "text" and b.get("text") == "" for b in blocks):
            problems.append(f"{where}: an empty text block")
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if turn["role"] == "assistant" and results:
            problems.append(f"{where}: a tool result in an assistant turn")
        if turn["role"] != "user":
            if not open_end and index + 1 == len(turns) and _calls(blocks):
                problems.append(f"{where}: calls {_calls(blocks)} have no results at the end")
            continue
        before = turns[index - 1]["content"] if index else []
        wanted = _calls(before)
        got = [b["tool_use_id"] for b in results]
        if sorted(got) != sorted(wanted):
            problems.append(f"{where}: results {got} do not answer calls {wanted}")
        if any(b.get("type") != "tool_result" for b in blocks[: len(results)]):
            problems.append(f"{where}: results must come first in the user turn")
    return problems


def _is_call(item: Message) -> bool:
    return str(item.get("type", "message")).endswith("_call") and "call_id" in item


def responses(items: Sequence[Message], *, open_end: bool) -> list[str]:
    """OpenAI Responses ``input`` items."""
    problems: list[str] = []
    calls: set[str] = set()
    answered: set[str | None] = set()
    for index, item in enumerate(items):
        if str(item.get("type", "message")).endswith("_call_output"):
            call = item.get("call_id")
            if call not in calls or call in answered:
                problems.append(f"input[{index}]: an output for {call!r} without its call")
            answered.add(call)
        elif _is_call(item):
            calls.add(item["call_id"])
    trailing: set[str] = set()
    for item in reversed(items if open_end else ()):
        if not _is_call(item):
            break
        trailing.add(item["call_id"])
    if unanswered := calls - answered - trailing:
        problems.append(f"end: calls {sorted(unanswered)} have no output")
    return problems


def _has(part: Message, *keys: str) -> bool:
    return any(key in part for key in keys)


def gemini(contents: Sequence[Message], *, open_end: bool) -> list[str]:
    """Gemini ``contents``."""
    problems: list[str] = []
    for index, content in enumerate(contents):
        where = f"contents[{index}]"
        parts = content["parts"]
        calls = [p for p in parts if _has(p, "functionCall", "function_call")]
        answers = [p for p in parts if _has(p, "functionResponse", "function_response")]
        if content["role"] == "model" and answers:
            problems.append(f"{where}: a function response in a model turn")
        if not parts:
            problems.append(f"{where}: a content with no parts")
        if answers and (index == 0 or contents[index - 1]["role"] != "model"):
            problems.append(f"{where}: responses with no model turn before")
        if not calls or (open_end and index + 1 == len(contents)):
            continue
        after = contents[index + 1] if index + 1 < len(contents) else {"role": None, "parts": []}
        if after["role"] != "user":
            problems.append(f"{where}: calls not followed by a user content")
        got = [p for p in after["parts"] if _has(p, "functionResponse", "function_response")]
        if len(got) != len(calls):
            problems.append(f"contents[{index + 1}]: {len(got)} responses for {len(calls)} calls")
    return problems


RULES: dict[str, Callable[..., list[str]]] = {
    "openai-chat": chat,
    "anthropic": anthropic,
    "openai-responses": responses,
    "gemini": gemini,
}


def problems(dialect: str, messages: Sequence[Message], *, open_end: bool) -> list[str]:
    """What the provider of ``dialect`` would refuse in ``messages`` (empty: nothing)."""
    found: list[str] = RULES[dialect](messages, open_end=open_end)
    return found


def _view_check(dialect: str) -> Callable[[Sequence[Message]], None]:
    def check(view: Sequence[Message]) -> None:
        """Fail on the first rule the view breaks (a view's newest calls may stay open)."""
        found = problems(dialect, view, open_end=True)
        if found:
            raise AssertionError("; ".join(found))

    return check


CHECKS: dict[str, Callable[[Sequence[Message]], None]] = {name: _view_check(name) for name in RULES}
"""Per dialect: fail unless the view keeps the provider's rules."""


def check_origins(
    history: Sequence[Message], view: Sequence[Any], origins: Sequence[int | None]
) -> None:
    """A patch's origins name each view message's history message: the caller's own object
    stands for its own index, a message of no history object was rebuilt from a message of
    its kind (the same role, and item type) or added by the view (None)."""
    if len(origins) != len(view):
        raise AssertionError(f"origins: {len(origins)} origins for a view of {len(view)} messages")
    own = {id(message): index for index, message in enumerate(history)}
    for position, (message, origin) in enumerate(zip(view, origins, strict=True)):
        where = f"view[{position}]"
        index = own.get(id(message))
        if index is not None and origin != index:
            raise AssertionError(
                f"{where}: history message {index} itself is given origin {origin}"
            )
        if index is None and origin is not None:
            original = history[origin]
            kind = (original.get("role"), original.get("type"))
            if (message.get("role"), message.get("type")) != kind:
                raise AssertionError(f"{where}: a rebuilt {kind} message is given origin {origin}")
