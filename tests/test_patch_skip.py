"""Views of a history with a deleted set as ``keep_from`` patches with ``skip`` runs: made turn
by turn, applied by the client library, over the wire to a real daemon, and never sent to a
caller that did not ask for them."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxwin import proto
from ctxwin.client import AsyncClient, Client
from ctxwin.engine import History, PatchMaker, TaskState, view_patch
from tests._daemon import DaemonFactory, DaemonProcess
from tests._strategies import apply, conversations, operations
from tests.test_auto_wire import MODEL, render


def wire(value: Any) -> Any:
    """``value`` as the other side of the wire decodes it."""
    return proto.unpack(proto.pack(value))


def kept_indices(length: int, patch: dict[str, Any]) -> list[int]:
    """The history index of each message of the view ``patch`` describes."""
    kept: dict[str, Any] = {
        key: patch[key] for key in ("length", "keep_from", "skip") if key in patch
    }
    return proto.apply_view_patch(list(range(length)), {**kept, "overrides": []})


ranges = st.lists(st.tuples(st.integers(2, 30), st.integers(0, 6)), max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversations(),
    st.lists(
        st.tuples(st.integers(0, 24), operations, ranges, st.booleans(), st.booleans()),
        min_size=1,
        max_size=6,
    ),
)
def test_every_view_with_gaps_is_rebuilt_from_its_patch(
    messages: list[dict[str, Any]], turns: list[tuple[int, Any, Any, bool, bool]]
) -> None:
    """Turn by turn (cuts, edits, ranges dropped), the patch with ``skip`` rebuilds the view."""
    maker = PatchMaker()
    history = History()
    state = TaskState()
    state.cache = history.cache  # views built on the last one, as the daemon builds them
    receiver = proto.PatchReceiver()
    ts = 0
    for cut, ops, drops, prepend, holds in [*turns, (len(messages), [], [], True, True)]:
        prefix = messages[: min(cut, len(messages))]
        common = 0
        while (
            common < min(len(prefix), len(history)) and history.messages[common] is prefix[common]
        ):
            common += 1
        history.apply(common, history.digest_of(common), prefix[common:])
        caller = [copy.deepcopy(message) for message in prefix]
        if len(prefix) < state.extent:
            state.start_over()  # as the daemon does for a history its edits are not of
        for op in ops:
            ts += 1000
            apply(state, history.messages, op, ts)
        ts += 1000
        # Turns before the newest ones, as ``auto`` drops them.
        newest = len(prefix) - 2
        state.drop([(first, min(first + size, newest)) for first, size in drops], ts)
        view = state.truncated_messages(history.messages)
        maker.expect_gaps(state.dropped)
        base = receiver.token if holds else None
        patch = maker.of_history(view, history, state.deleted_range, base, prepend=prepend)
        assert patch is not None
        rebuilt = receiver.apply(caller, wire(patch))
        assert rebuilt == view
        whole = view_patch(view, history.messages, state.deleted_range, state.dropped)
        assert proto.apply_view_patch(caller, wire(whole)) == view
        # The messages the view took as they were are the caller's own objects.
        for place, origin in enumerate(kept_indices(len(caller), patch)):
            if view[place] is history.messages[origin]:
                assert rebuilt[place] is caller[origin]
        assert receiver.origins() == kept_indices(len(caller), patch)


def test_a_patch_leaves_out_each_skipped_run() -> None:
    """``skip`` runs leave their messages out; the overrides stand at their own index."""
    history = [{"n": index} for index in range(12)]
    patch = {
        "length": 12,
        "keep_from": 3,
        "skip": [[5, 7], [9, 10]],
        "overrides": [[4, {"n": "four"}], [10, {"n": "ten"}]],
    }
    view = proto.apply_view_patch(history, patch)
    assert [message["n"] for message in view] == [0, 1, 3, "four", 7, 8, "ten", 11]
    assert proto.view_origins(12, patch, {}, {}) == [0, 1, 3, 4, 7, 8, 10, 11]


@pytest.mark.parametrize(
    ("skip", "overrides"),
    [
        ([[7, 5]], []),  # empty run
        ([[5, 8], [6, 9]], []),  # out of order
        ([[2, 4]], []),  # before keep_from
        ([[10, 13]], []),  # past the history
        ([[5, 7]], [[5, {"n": "gone"}]]),  # an override of a skipped message
        ("5-7", []),
        ([[5, 7]], [[4, [{"n": "a"}, {"n": "b"}]]]),  # a list override: the ordered form's
    ],
)
def test_a_skip_that_does_not_fit_is_refused(skip: Any, overrides: list[Any]) -> None:
    """A ``skip`` run that is empty, out of order or outside the view is a clear error."""
    history = [{"n": index} for index in range(12)]
    patch = {"length": 12, "keep_from": 3, "skip": skip, "overrides": overrides}
    with pytest.raises(ValueError, match="view patch"):
        proto.apply_view_patch(history, patch)


# Through the daemon ------------------------------------------------------------------------

STEPS = 40


@pytest.fixture(scope="module")
def daemon(daemon_factory: DaemonFactory) -> DaemonProcess:
    return daemon_factory()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with Client(daemon.endpoint, timeout=60) as connected:
        yield connected


def _whole_views(daemon: DaemonProcess, task: str) -> list[list[dict[str, Any]]]:
    """Every turn's view of the ``auto`` task, asked as whole lists (the reference)."""
    views = []
    messages = render("cline", STEPS)
    for end in range(2, len(messages) + 1, 2):
        args = {"task": task, "model": MODEL, "messages": messages[:end], "strategy": "auto"}
        reply = daemon.call("prepare_request", {**args, "pricing": "anthropic"})
        assert reply.ok, reply.message
        assert reply.result is not None
        views.append(reply.result["messages"])
    return views


def test_a_handle_gets_views_with_gaps_as_patches_equal_to_whole_views(
    daemon: DaemonProcess, client: Client
) -> None:
    """A task handle's views of an ``auto`` task with gaps come as ``skip`` patches, each
    equal to the view a whole-list request gets, and name each message's history index."""
    expected = _whole_views(daemon, "skip-whole")
    messages = render("cline", STEPS)
    task = client.task("skip-handle")
    gaps = 0
    for turn, end in enumerate(range(2, len(messages) + 1, 2)):
        result = task.prepare_request(messages[:end], MODEL, strategy="auto", pricing="anthropic")
        assert result["messages"] == expected[turn]
        origins = task.view_origins()
        assert origins is not None, f"turn {turn}: the view came whole"
        indices = [index for index in origins if index is not None]
        assert len(indices) == len(result["messages"])
        assert [messages[i]["role"] for i in indices] == [m["role"] for m in result["messages"]]
        gaps += any(b - a > 1 for a, b in itertools.pairwise(indices[2:]))
    assert gaps, "auto left turns out of the middle of the view"
    assert client.task("skip-handle").inspect()["dropped"]


@pytest.mark.anyio
async def test_an_async_handle_applies_the_same_patches(daemon: DaemonProcess) -> None:
    """The asyncio handle rebuilds the same views from the same ``skip`` patches."""
    expected = _whole_views(daemon, "skip-whole-async")
    messages = render("cline", STEPS)
    async with AsyncClient(daemon.endpoint, timeout=60) as client:
        task = client.task("skip-async")
        for turn, end in enumerate(range(2, len(messages) + 1, 2)):
            result = await task.prepare_request(
                messages[:end], MODEL, strategy="auto", pricing="anthropic"
            )
            assert result["messages"] == expected[turn]
            assert task.view_origins() is not None


def test_a_caller_that_does_not_apply_skip_gets_whole_views(daemon: DaemonProcess) -> None:
    """Asked for patches without ``patch_skip`` (a client from before the form), a view with
    gaps comes whole; the same request with it comes as a ``skip`` patch of that view."""
    messages = render("cline", STEPS)
    base = {"model": MODEL, "strategy": "auto", "pricing": "anthropic", "view": "patch"}
    gapped = plain = 0
    for end in range(2, len(messages) + 1, 2):
        args = {**base, "task": "skip-old", "messages": messages[:end]}
        old = daemon.call("prepare_request", args)
        new = daemon.call("prepare_request", {**args, "task": "skip-new", "patch_skip": True})
        assert old.ok
        assert new.ok
        assert old.result is not None
        assert new.result is not None
        if "skip" in new.result["patch"]:
            assert "patch" not in old.result  # the old caller gets that view whole
            patch = new.result["patch"]
            assert proto.apply_view_patch(messages[:end], patch) == old.result["messages"]
            gapped += 1
        else:
            plain += "patch" in old.result
    assert gapped, "auto left turns out of the middle of the view"
    assert plain, "views without gaps still come as patches to the old caller"
    assert "view_patch_skip" in daemon.call("ping", {}).result["features"]  # type: ignore[index]
