"""Hypothesis strategies for generated conversations, engine operations and wire values."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ctxwin.engine import TaskState, apply_truncation_notice, compact, condensed

PATHS = ["src/app.py", "src/ü.ts", "README.md", "a b/c.txt"]
MODEL = {"id": "test-model", "context_window": 64_000}


def msgpack_values(text: int, items: int, leaves: int) -> st.SearchStrategy[Any]:
    """Any value msgpack encodes: None, booleans, 64-bit integers, floats (NaN too), strings
    and bytes of up to ``text``, nested in lists and maps of up to ``items`` entries (keys of
    up to ``2 * items`` characters), ``leaves`` scalars at most."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**63), max_value=2**64 - 1)
        | st.floats()
        | st.text(max_size=text)
        | st.binary(max_size=text)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=items)
            | st.dictionaries(st.text(max_size=2 * items), inner, max_size=items)
        ),
        max_leaves=leaves,
    )


words = st.text(alphabet="abc xyz\n😀é", max_size=40)
paths = st.sampled_from(PATHS)


@st.composite
def user_content(draw: st.DrawFn, tool_ids: list[str]) -> Any:
    """A user message body: file reads in both formats, mentions, results, images."""
    kind = draw(st.integers(0, 6))
    blocks: list[dict[str, Any]] = []
    if kind == 0:
        return draw(words)
    if kind == 1:
        path = draw(paths)
        blocks = [
            {"type": "text", "text": f"[read_file for '{path}'] Result:"},
            {"type": "text", "text": draw(words)},
        ]
    elif kind == 2:
        path = draw(paths)
        blocks = [{"type": "text", "text": f"[read_file for '{path}'] Result:\n{draw(words)}"}]
    elif kind == 3:
        path = draw(paths)
        tool = draw(st.sampled_from(["write_to_file", "replace_in_file"]))
        body = f'<final_file_content path="{path}">\n{draw(words)}\n</final_file_content>'
        blocks = [{"type": "text", "text": f"[{tool} for '{path}'] Result:\n{body}"}]
    elif kind == 4:
        mentioned = draw(st.lists(paths, min_size=1, max_size=3))
        text = "see " + "".join(
            f'<file_content path="{path}">{draw(words)}</file_content>' for path in mentioned
        )
        blocks = [{"type": "text", "text": text}]
    elif kind == 5:
        blocks = [{"type": "image", "source": {"type": "base64", "data": "QUJD"}}]
    else:
        blocks = [{"type": "text", "text": draw(words)}]
    if tool_ids:
        results = [
            {"type": "tool_result", "tool_use_id": tool_id, "content": draw(words)}
            for tool_id in tool_ids
            if draw(st.booleans()) or draw(st.booleans())
        ]
        results = draw(st.permutations(results))
        place_first = draw(st.booleans())
        blocks = [*results, *blocks] if place_first else [*blocks, *results]
    return blocks


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Alternating user/assistant messages, user first, each tagged with its index."""
    count = draw(st.integers(0, 24))
    messages: list[dict[str, Any]] = []
    pending: list[str] = []
    for index in range(count):
        if index % 2 == 0:
            content = (
                draw(user_content(pending))
                if index
                else [{"type": "text", "text": "<task>do it</task>"}]
            )
            messages.append({"role": "user", "content": content, "ts": index})
            pending = []
        else:
            uses = draw(st.integers(0, 2))
            pending = [f"tool-{index}-{n}" for n in range(uses)]
            blocks: list[dict[str, Any]] = [{"type": "text", "text": draw(words)}]
            blocks += [
                {"type": "tool_use", "id": tool_id, "name": "read_file", "input": {"p": 1}}
                for tool_id in pending
            ]
            content = blocks if uses or draw(st.booleans()) else draw(words)
            messages.append({"role": "assistant", "content": content, "ts": index})
    return messages


operations = st.lists(
    st.one_of(
        st.tuples(st.just("prepare"), st.integers(0, 200_000)),
        st.tuples(st.just("optimize"), st.just(0)),
        st.tuples(st.just("compact"), st.sampled_from(["quarter", "none"])),
        st.tuples(st.just("notice"), st.just(0)),
        st.tuples(st.just("condensed"), st.just(0)),
    ),
    max_size=8,
)


def apply(state: TaskState, messages: list[dict[str, Any]], op: tuple[str, Any], ts: int) -> None:
    """Run one generated operation at time ``ts``."""
    name, value = op
    if name == "prepare":
        usage = {"ts": ts, "tokens_in": value}
        state.prepare_request(messages, usage, MODEL)
    elif name == "optimize":
        state.optimize_file_reads(messages, ts)
    elif name == "compact":
        compact(state, messages, value, ts)
    elif name == "notice":
        apply_truncation_notice(state, ts, messages)
    else:
        condensed(state, messages)


def run_all(messages: list[dict[str, Any]], ops: list[tuple[str, Any]]) -> TaskState:
    state = TaskState()
    for ts, op in enumerate(ops, start=1):
        apply(state, messages, op, ts * 1000)
    return state
