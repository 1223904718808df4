"""Views of a history with a deleted set as ``keep_from`` patches with ``skip`` runs: made turn
by turn, applied by the client library, over the wire to a real daemon, and never sent to a
caller that did not ask for them."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.client import AsyncClient, Client
from tests._daemon import DaemonProcess
from tests.test_auto_wire import MODEL, render


def wire(value: Any) -> Any:
    """``value`` as the other side of the wire decodes it."""
    return proto.unpack(proto.pack(value))


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
    shared_daemon: DaemonProcess,
) -> None:
    """A task handle's views of an ``auto`` task with gaps come as ``skip`` patches, each
    equal to the view a whole-list request gets, and name each message's history index."""
    expected = _whole_views(shared_daemon, "skip-whole")
    messages = render("cline", STEPS)
    client = Client(shared_daemon.endpoint, timeout=60)
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
    client.close()


@pytest.mark.anyio
async def test_an_async_handle_applies_the_same_patches(shared_daemon: DaemonProcess) -> None:
    """The asyncio handle rebuilds the same views from the same ``skip`` patches."""
    expected = _whole_views(shared_daemon, "skip-whole-async")
    messages = render("cline", STEPS)
    async with AsyncClient(shared_daemon.endpoint, timeout=60) as client:
        task = client.task("skip-async")
        for turn, end in enumerate(range(2, len(messages) + 1, 2)):
            result = await task.prepare_request(
                messages[:end], MODEL, strategy="auto", pricing="anthropic"
            )
            assert result["messages"] == expected[turn]
            assert task.view_origins() is not None


def test_a_caller_that_does_not_apply_skip_gets_whole_views(
    shared_daemon: DaemonProcess,
) -> None:
    """Asked for patches without ``patch_skip`` (a client from before the form), a view with
    gaps comes whole; the same request with it comes as a ``skip`` patch of that view."""
    messages = render("cline", STEPS)
    base = {"model": MODEL, "strategy": "auto", "pricing": "anthropic", "view": "patch"}
    gapped = plain = 0
    for end in range(2, len(messages) + 1, 2):
        args = {**base, "task": "skip-old", "messages": messages[:end]}
        old = shared_daemon.call("prepare_request", args)
        new = shared_daemon.call(
            "prepare_request", {**args, "task": "skip-new", "patch_skip": True}
        )
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
    assert "view_patch_skip" in shared_daemon.call("ping", {}).result["features"]  # type: ignore[index]
