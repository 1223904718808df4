"""The worked examples of SPEC.md, and edge cases it calls out."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxwin import proto
from ctxwin.engine import (
    CorruptStateError,
    Notices,
    TaskState,
    apply_truncation_notice,
    compact,
    context_window_info,
    next_truncation_range,
    should_compact,
    truncated_messages,
    utf16_len,
)
from ctxwin.engine._optimize import (
    FILE_CONTENT,
    FINAL_FILE_CONTENT,
    final_body,
    mention_elements,
)


def alternating(count: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if index % 2 == 0 else "assistant", "content": f"m{index}"}
        for index in range(count)
    ]


@pytest.mark.parametrize(
    ("model", "window", "limit"),
    [
        ({"id": "m", "context_window": 64_000}, 64_000, 37_000),
        ({"id": "m", "context_window": 128_000}, 128_000, 98_000),
        ({"id": "m", "context_window": 200_000}, 200_000, 160_000),
        ({"id": "m", "context_window": 1_000_000}, 1_000_000, 960_000),
        ({"id": "m", "context_window": 100_001}, 100_001, 80_000.8),
        ({"id": "m", "context_window": None}, 128_000, 98_000),
        ({"id": "m", "context_window": 0}, 128_000, 98_000),
        ({"id": "m"}, 128_000, 98_000),
        ({"id": "DeepSeek-V3", "context_window": 64_000, "provider": "openai"}, 128_000, 98_000),
        ({"id": "deepseek-chat", "context_window": 64_000}, 64_000, 37_000),
    ],
)
def test_context_window_info(model: dict[str, Any], window: int, limit: float) -> None:
    """Windows and limits follow SPEC.md §2, with fractions kept as floats."""
    info = context_window_info(model)
    assert (window, limit) == (info.context_window, info.max_allowed_size)
    assert isinstance(info.max_allowed_size, int) == float(limit).is_integer()


@pytest.mark.parametrize(
    ("usage", "fraction", "compact"),
    [
        ({"tokens_in": 33_000}, 0.75, False),
        ({"tokens_in": 155_000}, 0.75, True),
        ({"tokens_in": 155_000}, None, False),
        ({"tokens_in": 165_000}, 1.0, True),
        ({"tokens_in": 155_000}, 0, False),
        ({"tokens_in": 100_000, "cache_reads": 60_000}, None, True),
        (None, 0.5, False),
    ],
)
def test_should_compact_examples(
    usage: dict[str, int] | None, fraction: float | None, compact: bool
) -> None:
    """The examples of SPEC.md §2 on a 200000 window."""
    decision = should_compact(usage, {"id": "m", "context_window": 200_000}, fraction)
    assert compact == decision.compact


def test_should_compact_reports_the_numbers_it_compared() -> None:
    """The wire result carries the total and the threshold after the cap."""
    decision = should_compact({"tokens_in": 1, "tokens_out": 2}, {"id": "m"}, 1.0)
    assert {"compact": False, "total_tokens": 3, "threshold_tokens": 98_000} == decision.wire()


def test_should_compact_holds_back_when_two_or_fewer_messages_follow_the_range() -> None:
    """Auto-condense never triggers with only the last request and answer active (§8)."""
    usage = {"tokens_in": 190_000}
    model = {"id": "m", "context_window": 200_000}
    assert not should_compact(usage, model, 0.75, [2, 7], alternating(10)).compact
    assert should_compact(usage, model, 0.75, [2, 5], alternating(10)).compact


@pytest.mark.parametrize(
    ("count", "previous", "keep", "expected"),
    [
        (11, None, "half", [2, 5]),
        (11, None, "quarter", [2, 7]),
        (21, None, "half", [2, 9]),
        (21, [2, 9], "half", [2, 13]),
        (3, None, "half", [2, 1]),
        (11, None, "none", [2, 9]),
        (11, None, "lastTwo", [2, 7]),
        (4, [2, 9], "quarter", [2, 3]),
    ],
)
def test_next_truncation_range_examples(
    count: int, previous: list[int] | None, keep: str, expected: list[int]
) -> None:
    """The examples of SPEC.md §3, plus a past-the-end range that is never used as an index."""
    assert expected == next_truncation_range(alternating(count), previous, keep)


def test_quarter_floors_negative_counts() -> None:
    """floor(n*3/4/2), not truncation toward zero, when the range passed the end."""
    # rest = 12, n = -7: floor(-21/8) = -3 -> remove -6 -> end = 5; message 5 is assistant.
    assert [2, 5] == next_truncation_range(alternating(5), [2, 11], "quarter")


@pytest.mark.parametrize(
    ("messages", "keep"),
    [
        ([], "half"),
        ([{"role": "user", "content": "a"}], "quarter"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "none"),
    ],
)
def test_a_range_that_would_end_below_1_is_the_empty_range(
    messages: list[dict[str, Any]], keep: str
) -> None:
    """Histories of fewer than 3 messages, or a user at index 1, give [2, 1], never [2, 0].

    SPEC.md §3's arithmetic alone gives [2, -1] or [2, 0] here, which would
    keep message 1 twice (view = messages[0:2] + messages[end + 1:]).
    """
    found = next_truncation_range(messages, None, keep)
    assert [2, 1] == found
    assert proto.deleted_range_error(found) is None
    assert proto.deleted_range_error([2, 0]) is not None


def test_unknown_keep_is_refused() -> None:
    """A keep strategy outside the four is a programming error."""
    with pytest.raises(ValueError, match="keep"):
        next_truncation_range(alternating(5), None, "most")


def test_a_range_ending_before_message_one_never_repeats_the_first_pair() -> None:
    """The view never uses a negative or tiny range end as an index."""
    messages = alternating(6)
    assert messages == truncated_messages(messages, [2, -3])
    assert messages == truncated_messages(messages, [2, 0])


def test_fewer_than_two_messages_come_back_unchanged() -> None:
    """SPEC.md §4 step 1."""
    assert [] == truncated_messages([], [2, 5])
    one = [{"role": "user", "content": "x"}]
    assert one == truncated_messages(one, None)


def test_orphaned_results_after_the_range_are_dropped() -> None:
    """The first kept user message loses tool results whose tool_use was cut (§4 step 3)."""
    messages = [
        *alternating(4),
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "gone", "content": "x"},
                {"type": "text", "text": "hello"},
            ],
        },
    ]
    view = truncated_messages(messages, [2, 3])
    assert [{"type": "text", "text": "hello"}] == view[2]["content"]
    assert "tool_result" == messages[4]["content"][0]["type"]


def test_missing_and_misordered_results_are_repaired() -> None:
    """Results are put first in tool_use order; a missing one is invented (§4 step 5)."""
    notices = Notices(missing_result="MISSING")
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "a", "name": "x", "input": {}},
                {"type": "tool_use", "id": "b", "name": "x", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "note"},
                {"type": "tool_result", "tool_use_id": "b", "content": "B"},
                {"type": "tool_result", "tool_use_id": "zzz", "content": "stray"},
            ],
        },
    ]
    view = truncated_messages(messages, None, None, notices)
    assert [
        {"type": "tool_result", "tool_use_id": "a", "content": "MISSING"},
        {"type": "tool_result", "tool_use_id": "b", "content": "B"},
        {"type": "text", "text": "note"},
    ] == view[2]["content"]


def test_utf16_lengths_count_astral_characters_twice() -> None:
    """Lengths are UTF-16 code units, as SPEC.md §6 requires."""
    assert (3, 2, 4) == (utf16_len("abc"), utf16_len("😀"), utf16_len("é😀a"))


def test_file_mention_replacement_is_literal() -> None:
    """Dollar patterns in file content are not interpreted when replacing (§6)."""
    body = "s.replace(/(a)/, '$1 $& $$')"
    mention = f'<file_content path="p.js">{body}</file_content>'
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": f"A {mention} B"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": f"C {mention}"}]},
    ]
    state = TaskState(Notices(duplicate_file_read="GONE"))
    assert state.optimize_file_reads(messages, 5)["changed"]
    view = state.truncated_messages(messages)
    assert 'A <file_content path="p.js">GONE</file_content> B' == view[2]["content"][0]["text"]
    assert f"C {mention}" == view[4]["content"][0]["text"]


def test_each_update_owns_its_metadata() -> None:
    """A later mention update never changes the lists of an earlier one (§1)."""

    def mention(path: str) -> str:
        return f'<file_content path="{path}">x</file_content>'

    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": mention("a") + mention("b")}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": mention("a")}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": mention("b")}]},
    ]
    state = TaskState()
    state.optimize_file_reads(messages[:5], 1)
    first = state.dump_updates()[0][1][1][0][1][0][3]
    assert [["a"], ["a", "b"]] == first
    state.optimize_file_reads(messages, 2)
    updates = state.dump_updates()[0][1][1][0][1]
    assert [["a"], ["a", "b"]] == updates[0][3]
    assert [["a", "b"], ["a", "b"]] == updates[1][3]


def test_rollback_removes_newer_updates_and_empty_entries() -> None:
    """Rollback drops trailing updates newer than the checkpoint (§9)."""
    state = TaskState()
    messages = alternating(12)
    apply_truncation_notice(state, 100, messages)
    compact(state, messages, "quarter", 200)
    assert 0 == state.rollback(100)
    assert 1 == state.rollback(99)
    assert [] == state.dump_updates()


@pytest.mark.parametrize(
    "stored",
    [
        {"not": "a list"},
        [[1]],
        [[1, [0, [[0, [["ts", "text", ["x"], []]]]]]]],
        [[1, [0, [[0, [[1, "text", [5], []]]]]]]],
        [["1", [0, []]]],
    ],
)
def test_corrupt_stored_overlays_are_refused(stored: object) -> None:
    """A stored overlay of the wrong shape raises CorruptStateError, never a crash later."""
    with pytest.raises(CorruptStateError):
        TaskState.load(stored)


def test_revision_counts_changes_that_need_a_write() -> None:
    """Persisted changes bump the revision; in-memory optimisation and no-ops do not."""
    state = TaskState()
    messages = alternating(12)
    state.deleted_range = None
    assert 0 == state.revision
    state.deleted_range = [2, 5]
    assert 1 == state.revision
    state.optimize_file_reads_in_memory(messages, 1)
    state.truncated_messages(messages)
    assert 1 == state.revision
    apply_truncation_notice(state, 5, messages)
    assert 2 == state.revision


fragments = st.lists(
    st.sampled_from(
        [
            '<file_content path="a">',
            '<file_content path="b c">',
            "</file_content>",
            '<final_file_content path="x">',
            "</final_file_content>",
            "body\n",
            '"',
            "<",
            ">",
            "😀",
        ]
    ),
    max_size=12,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(fragments)
def test_element_search_equals_the_spec_patterns(text: str) -> None:
    """The fast element search finds exactly what SPEC.md §6's non-greedy patterns find."""
    final = FINAL_FILE_CONTENT.search(text)
    expected = (final.start(2), final.end(2)) if final else None
    assert expected == final_body(text)
    assert [(m.group(1), m.group(0)) for m in FILE_CONTENT.finditer(text)] == mention_elements(text)
