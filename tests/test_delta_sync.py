"""Delta sync end to end: the client library against the real daemon, views equal to full mode."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxwin import proto
from ctxwin.client import AsyncClient, Client, RequestTimeoutError, Task, _core
from ctxwin.client._core import Call
from ctxwin.client._delta import DeltaSync
from tests._client_fake import FakeRouter, error, ok
from tests._daemon import DaemonFactory, DaemonProcess, wait_until
from tests._scenarios import (
    PLACEHOLDER_ENV,
    Scenario,
    expand_args,
    expected_value,
    load_scenarios,
)

SCENARIOS = load_scenarios()
HISTORY_OPS = {op for op, spec in proto.OPS.items() if ("messages", "append") in spec.one_of}
MODEL: proto.Model = {"id": "claude-sonnet-4-5", "context_window": 200_000}


@pytest.fixture(scope="module")
def delta_daemon(daemon_factory: DaemonFactory) -> DaemonProcess:
    """A shared daemon with the scenarios' placeholder notices (their tasks: not the wire's)."""
    return daemon_factory(env=PLACEHOLDER_ENV, group="delta")


@pytest.fixture(scope="module")
def delta_client(delta_daemon: DaemonProcess) -> Iterator[Client]:
    with Client(delta_daemon.endpoint, timeout=30) as client:
        yield client


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_by_delta_gives_the_same_results(
    scenario: Scenario, delta_daemon: DaemonProcess, delta_client: Client
) -> None:
    """Every scenario's expected results, with history ops sent by the library's delta sync."""
    if scenario.initial_updates is not None:
        task_dir = delta_daemon.task_dir(scenario.task)
        task_dir.mkdir(parents=True)
        (task_dir / "context_history.json").write_text(json.dumps(scenario.initial_updates))
    sync = DeltaSync()
    features = delta_client.ping()["features"]
    deltas = 0
    for number, step in enumerate(scenario.steps):
        args = expand_args(step["args"], scenario.conversation)
        op = step["op"]
        if op in HISTORY_OPS and "messages" in args:
            messages = args.pop("messages")
            call: Call[Any] = sync.call(Call(op, args), messages, features)
            deltas += "append" in call.args
            result: dict[str, Any] = dict(delta_client.call(call))
        else:
            result = dict(delta_client.call(Call(op, args)))
        for key, expected in step["expect"].items():
            left, right = expected_value(expected, result.get(key))
            assert left == right, f"step {number} ({op}): {key}"
    history_steps = sum(step["op"] in HISTORY_OPS for step in scenario.steps)
    assert deltas == max(history_steps - 1, 0), "every history op after the first is a delta"
    delta_client.close_task(scenario.task)


def conversation(turns: int, tag: str = "") -> list[dict[str, Any]]:
    """A task: its first pair, then ``turns`` turns re-reading one file."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": f"<task>Fix parser{tag}</task>"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Reading it."}]},
    ]
    for index in range(turns):
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "[read_file for 'src/parser.py'] Result:"},
                    {"type": "text", "text": f"def parse(): return {index}\n" * 20},
                ],
            }
        )
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"ok {index}"}]})
    return messages


def both(client: Client, name: str) -> tuple[Task, Task]:
    """A task synced by delta and its twin sent whole lists, for comparing views."""
    return client.task(f"{name}-delta"), client.task(f"{name}-full", delta=False)


def same_views(delta: Task, full: Task, messages: list[dict[str, Any]], ts: int) -> None:
    """Both handles answer optimise-then-view with equal results."""
    assert full.optimize_file_reads(messages, ts=ts) == delta.optimize_file_reads(messages, ts=ts)
    expected = full.truncated_messages(messages)
    assert expected == delta.truncated_messages(messages)
    usage: proto.Usage = {"ts": ts, "tokens_in": 190_000, "tokens_out": 500}
    want = full.prepare_request(messages, MODEL, previous_request=usage)
    assert want == delta.prepare_request(messages, MODEL, previous_request=usage)


def refusals(daemon: DaemonProcess, code: str) -> int:
    return daemon.log().count(f'"code": "{code}"')


def test_turns_append_and_views_match_full_mode(delta_daemon: DaemonProcess) -> None:
    """Turn after turn the delta handle sends only new messages and sees the full-mode views."""
    with Client(delta_daemon.endpoint) as client:
        delta, full = both(client, "turns")
        messages = conversation(2)
        for turn in range(6):
            same_views(delta, full, messages, 1_000 + turn)
            messages = [*messages, *conversation(turn + 3)[-2:]]
        held = delta.inspect()["history"]
        assert held == len(messages) - 2  # the last turn's messages are not sent yet
        assert full.inspect()["history"] is None  # whole lists are not kept
        assert delta.delta


def test_tool_results_filled_in_turn_after_turn_match_full_mode(
    delta_daemon: DaemonProcess,
) -> None:
    """User messages lacking their tool results: delta views equal full ones, the reply small."""
    messages: list[dict[str, Any]] = conversation(0)
    with Client(delta_daemon.endpoint) as client:
        delta, full = both(client, "fills")
        for turn in range(5):
            messages = [
                *messages,
                {"role": "user", "content": [{"type": "text", "text": f"ran {turn}\n" * 200}]},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": f"t{turn}", "name": "run", "input": {}}],
                },
            ]
            view = delta.truncated_messages(messages)["messages"]
            assert full.truncated_messages(messages)["messages"] == view
            usage: proto.Usage = {"ts": turn, "tokens_in": 1_000, "tokens_out": 50}
            want = full.prepare_request(messages, MODEL, previous_request=usage)
            assert want == delta.prepare_request(messages, MODEL, previous_request=usage)
        newest: Any = view[-2]
        assert [block["type"] for block in newest["content"]] == ["tool_result", "text"]
        assert newest["content"][1] is messages[-2]["content"][0]  # the caller's own block
    chain = proto.DigestChain(messages)
    asked: dict[str, Any] = {
        "task": "fills-delta",
        "base": len(messages),
        "append": [],
        "view": "patch_prepend",
    }
    asked["base_digest"] = chain.digest(len(messages))
    reply = delta_daemon.call("truncated_messages", asked)
    assert reply.result is not None
    patch = reply.result["patch"]
    assert len(messages) - 2 in [origin for origin, _ in patch["prepend"]]
    assert patch["overrides"] == []


def test_a_rewritten_history_and_a_dropped_tail_resync_or_cut(delta_daemon: DaemonProcess) -> None:
    """Messages replaced in the middle and a dropped trailing message give full-mode views."""
    with Client(delta_daemon.endpoint) as client:
        delta, full = both(client, "rewrite")
        messages = conversation(5)
        same_views(delta, full, messages, 10)
        rewritten = copy.deepcopy(messages)
        rewritten[4]["content"][1]["text"] = "def parse(): return 'rewritten'\n"
        same_views(delta, full, rewritten, 11)
        dropped = rewritten[:-1]  # a resumed task drops its unanswered last message
        same_views(delta, full, dropped, 12)
        assert delta.inspect()["history"] == len(dropped)
        # In-place edits of old messages need resync(): then the whole list goes once.
        dropped[2]["content"][1]["text"] = "edited in place\n"
        delta.resync()
        same_views(delta, full, dropped, 13)


def test_resync_after_restart_and_idle_eviction(tmp_path: Path) -> None:
    """After a daemon restart and after an idle eviction the next delta resyncs by itself."""
    with (
        DaemonProcess(tmp_path, "--idle-timeout", "0.3") as daemon,
        Client(daemon.endpoint, timeout=30) as client,
    ):
        delta, full = both(client, "restart")
        messages = conversation(4)
        same_views(delta, full, messages, 20)
        assert refusals(daemon, "resync_required") == 0
        daemon.restart()
        messages = [*messages, *conversation(5)[-2:]]
        same_views(delta, full, messages, 21)
        assert refusals(daemon, "resync_required") == 1
        stopped = daemon.log().count('"event": "actor_stopped"')
        wait_until(  # both tasks' actors stop, and their kept histories with them
            lambda: daemon.log().count('"event": "actor_stopped"') >= stopped + 2,
            10,
            "idle eviction",
        )
        messages = [*messages, *conversation(6)[-2:]]
        same_views(delta, full, messages, 22)
        assert refusals(daemon, "resync_required") == 2


@pytest.mark.anyio
async def test_concurrent_calls_on_one_handle_apply_in_call_order(tmp_path: Path) -> None:
    """Calls gathered on one async handle after a restart: one resync, then deltas, in order."""
    with DaemonProcess(tmp_path) as daemon:
        async with AsyncClient(daemon.endpoint, timeout=30) as client:
            task = client.task("gathered")
            histories = [conversation(turns) for turns in range(2, 7)]
            await task.truncated_messages(histories[0])
            daemon.restart()  # the daemon no longer holds the history the handle sent
            views = await asyncio.gather(
                *(task.truncated_messages(history) for history in histories[1:])
            )
            assert [len(view["messages"]) for view in views] == [
                len(history) for history in histories[1:]
            ]
            assert refusals(daemon, "resync_required") == 1, "only the first call resyncs"
            assert (await task.inspect())["history"] == len(histories[-1])


@pytest.mark.anyio
@pytest.mark.parametrize("resync", [False, True], ids=["delta", "after-resync"])
async def test_a_list_appended_to_while_a_call_is_out_keeps_its_view(
    tmp_path: Path, resync: bool
) -> None:
    """The call syncs and views the list as it was when called, whatever the caller does next.

    With ``resync`` the daemon has lost the history, so the call is sent twice.
    """
    with DaemonProcess(tmp_path) as daemon:
        async with AsyncClient(daemon.endpoint, timeout=30) as client:
            task = client.task("appended-meanwhile")
            messages = conversation(2)
            await task.truncated_messages(messages)
            if resync:
                await asyncio.to_thread(daemon.restart)
            messages.extend(conversation(3)[-2:])
            sent = len(messages)
            pending = asyncio.ensure_future(task.truncated_messages(messages))
            await asyncio.sleep(0)  # the request is built and sent
            messages.extend(conversation(4)[-2:])
            assert len((await pending)["messages"]) == sent
            assert (await task.inspect())["history"] == sent
            assert len((await task.truncated_messages(messages))["messages"]) == len(messages)
        assert refusals(daemon, "resync_required") == int(resync)


def test_overlapping_calls_on_one_handle_work_on_every_event_loop(
    delta_daemon: DaemonProcess,
) -> None:
    """The handle's turn-taking serves whichever loop it is used on, one loop after another."""
    client = AsyncClient(delta_daemon.endpoint, timeout=30)
    task = client.task("two-loops")
    history = conversation(3)

    async def overlapping() -> int:
        views = await asyncio.gather(
            task.truncated_messages(history), task.truncated_messages(history)
        )
        return sum(len(view["messages"]) for view in views)

    assert asyncio.run(overlapping()) == 2 * len(history)
    assert asyncio.run(overlapping()) == 2 * len(history)
    asyncio.run(client.aclose())


@pytest.mark.anyio
async def test_waiting_behind_a_slow_call_counts_against_the_timeout(tmp_path: Path) -> None:
    """A history op queued behind another on its handle times out on its own deadline."""
    with FakeRouter(tmp_path, lambda request: []) as silent:  # never answers
        async with AsyncClient(silent.endpoint, timeout=30) as client:
            task = client.task("queued")
            history = conversation(1)
            slow = asyncio.ensure_future(task.truncated_messages(history, timeout=3))
            await asyncio.sleep(0)
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError, match="earlier calls on this task handle"):
                await task.truncated_messages(history, timeout=0.3)
            assert time.monotonic() - started < 2.5
            with pytest.raises(RequestTimeoutError):
                await slow


def test_a_timeout_longer_than_one_poll_slice_is_waited_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocking client waits in slices; a timeout of several slices is waited in full."""
    monkeypatch.setattr(_core, "POLL_SLICE", 0.1)
    with FakeRouter(tmp_path, lambda request: []) as silent, Client(silent.endpoint) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError):
            client.ping(timeout=0.6)
        assert time.monotonic() - started >= 0.55


def test_memory_cap_evicts_the_least_recently_used_history(tmp_path: Path) -> None:
    """With room for one history, using another task drops the first one's copy."""
    with (
        DaemonProcess(tmp_path, "--history-cache-mb", "0") as daemon,
        Client(daemon.endpoint) as client,
    ):
        first, second = client.task("lru-a"), client.task("lru-b")
        messages = conversation(3)
        first.truncated_messages(messages)
        assert first.inspect()["history"] == len(messages)
        second.truncated_messages(messages)
        assert first.inspect()["history"] is None
        assert second.inspect()["history"] == len(messages)
        view = first.truncated_messages([*messages, *conversation(4)[-2:]])["messages"]
        assert len(view) == len(messages) + 2
        assert refusals(daemon, "resync_required") == 1
        assert '"event": "history_evicted"' in daemon.log()


def test_wire_refusals_of_bad_deltas(delta_daemon: DaemonProcess) -> None:
    """A delta on a task without a kept history, or with a wrong digest, is resync_required."""
    messages = conversation(2)
    args = {"task": "raw-delta", "base": 0, "base_digest": bytes(16), "append": messages}
    reply = delta_daemon.call("truncated_messages", args)
    assert (reply.ok, reply.code) == (False, "resync_required")
    assert "send the whole list" in (reply.message or "")
    full = delta_daemon.call(
        "truncated_messages", {"task": "raw-delta", "messages": messages, "view": "patch"}
    )
    assert full.ok
    assert full.result is not None
    patch = full.result["patch"]
    assert isinstance(patch.pop("token"), bytes)
    assert patch == {"length": len(messages), "keep_from": 2, "overrides": []}
    chain = proto.DigestChain(messages)
    wrong = {**args, "base": 3, "base_digest": chain.digest(2)}
    reply = delta_daemon.call("truncated_messages", wrong)
    assert (reply.ok, reply.code) == (False, "resync_required")
    right = {**args, "base": 3, "base_digest": chain.digest(3), "append": messages[3:]}
    reply = delta_daemon.call("truncated_messages", right)
    assert reply.ok
    assert reply.result is not None
    assert reply.result["messages"] == messages


def test_a_daemon_without_delta_sync_gets_whole_lists(tmp_path: Path) -> None:
    """A daemon whose ping names no delta sync gets whole lists: the handle turns it off."""

    def old_daemon(request: proto.Request) -> list[bytes]:
        if request.op == "ping":
            return ok(request)  # from before features were listed
        unknown = sorted(
            {"base", "base_digest", "append", "view", "patch_base"} & set(request.args)
        )
        if unknown:
            return error(request, "bad_request", f"{request.op}: unknown argument(s) {unknown}")
        return ok(request, {"messages": request.args["messages"]})

    messages = conversation(1)
    with FakeRouter(tmp_path, old_daemon) as router, Client(router.endpoint) as client:
        task = client.task("old")
        assert task.truncated_messages(messages)["messages"] == messages
        assert not task.delta
        assert task.truncated_messages(messages)["messages"] == messages
        ops = [request.op for request in router.requests]
        assert ops == ["ping", "truncated_messages", "truncated_messages"]
        assert not any("view" in request.args for request in router.requests)


def test_a_daemon_without_the_prepend_form_gets_plain_patch_requests(tmp_path: Path) -> None:
    """A daemon whose ping names patches but not the prepend form is asked for plain
    patches; its features are asked once on a connection."""
    features = [name for name in proto.FEATURES if name != "view_patch_prepend"]

    def older_daemon(request: proto.Request) -> list[bytes]:
        if request.op == "ping":
            return ok(request, {"pong": True, "version": "x", "proto": 1, "features": features})
        if request.args.get("view") not in (None, "list", "patch"):
            return error(request, "bad_request", f"{request.op}: view must be one of list, patch")
        return ok(request, {"messages": request.args["messages"]})

    messages = conversation(1)
    with FakeRouter(tmp_path, older_daemon) as router, Client(router.endpoint) as client:
        task = client.task("older")
        assert task.truncated_messages(messages)["messages"] == messages
        assert task.delta
        assert client.task("other").truncated_messages(messages)["messages"] == messages
        views = [(request.op, request.args.get("view")) for request in router.requests]
        assert views == [
            ("ping", None),
            ("truncated_messages", "patch"),
            ("truncated_messages", "patch"),
        ]


def test_a_daemon_without_the_skip_form_is_not_told_the_handle_applies_it(
    tmp_path: Path,
) -> None:
    """A daemon whose ping does not name ``view_patch_skip`` gets no ``patch_skip`` (which it
    would refuse as an unknown argument); one that names it does."""
    answers = [[name for name in proto.FEATURES if name != "view_patch_skip"], list(proto.FEATURES)]
    messages = conversation(1)

    def daemon(request: proto.Request) -> list[bytes]:
        if request.op == "ping":
            pong = {"pong": True, "version": "x", "proto": 1, "features": answers.pop(0)}
            return ok(request, pong)
        return ok(request, {"messages": request.args["messages"]})

    for _ in range(2):
        with FakeRouter(tmp_path, daemon) as router, Client(router.endpoint) as client:
            client.task("skip").truncated_messages(messages)
            sent = router.requests[-1].args
        assert sent["view"] == "patch_prepend"
        assert sent.get("patch_skip") is (None if answers else True)


@pytest.mark.anyio
async def test_an_async_handle_reads_the_daemon_s_features_once(tmp_path: Path) -> None:
    """The asyncio twin asks ping's features once on a connection and keeps to them."""
    features = ["delta"]  # delta sync, but views only as whole lists

    def daemon(request: proto.Request) -> list[bytes]:
        if request.op == "ping":
            return ok(request, {"pong": True, "version": "x", "proto": 1, "features": features})
        return ok(request, {"messages": messages})

    messages = conversation(1)
    with FakeRouter(tmp_path, daemon) as router:
        async with AsyncClient(router.endpoint) as client:
            task = client.task("async-old")
            assert (await task.truncated_messages(messages))["messages"] == messages
            assert (await task.truncated_messages(messages))["messages"] == messages
        asked = [(request.op, "view" in request.args) for request in router.requests]
    assert asked == [("ping", False), ("truncated_messages", False), ("truncated_messages", False)]
    assert "append" in router.requests[-1].args


def test_each_connection_asks_the_daemon_s_features_again(tmp_path: Path) -> None:
    """A new connection (after a timeout renews the socket) reads ping's features again:
    an older daemon behind the same endpoint gets requests it understands."""
    answers = [list(proto.FEATURES), []]
    silent = {"once": True}
    messages = conversation(1)

    def daemon(request: proto.Request) -> list[bytes]:
        if request.op == "ping":
            pong = {"pong": True, "version": "x", "proto": 1, "features": answers.pop(0)}
            return ok(request, pong)
        if request.op == "stats" and silent.pop("once", False):
            return []  # no answer: the client times out and starts a new socket
        return ok(request, {"messages": messages})

    with FakeRouter(tmp_path, daemon) as router, Client(router.endpoint) as client:
        task = client.task("renewed")
        task.truncated_messages(messages)
        task.truncated_messages(messages)
        with pytest.raises(RequestTimeoutError):
            client.stats(timeout=0.2)
        task.truncated_messages(messages)
        asked = [(request.op, sorted(request.args)) for request in router.requests]
    assert asked == [
        ("ping", []),
        ("truncated_messages", ["messages", "patch_skip", "task", "view"]),
        ("truncated_messages", ["append", "base", "base_digest", "patch_skip", "task", "view"]),
        ("stats", []),
        ("ping", []),
        ("truncated_messages", ["messages", "task"]),
    ]
    assert not task.delta


def test_patches_resend_only_new_overrides_to_a_caller_that_holds_the_last(
    delta_daemon: DaemonProcess,
) -> None:
    """With patch_base naming the last patch, unchanged overlaid messages are not sent again."""
    messages = conversation(4)
    task = {"task": "reuse"}
    optimised = delta_daemon.call("optimize_file_reads", {**task, "messages": messages, "ts": 5})
    assert optimised.ok
    first = delta_daemon.call("truncated_messages", {**task, "messages": messages, "view": "patch"})
    assert first.result is not None
    patch = first.result["patch"]
    assert [2, 4, 6] == [origin for origin, _ in patch["overrides"]]  # three stale reads
    assert "reuse" not in patch
    receiver = proto.PatchReceiver()
    assert receiver.apply(messages, patch)[2] == patch["overrides"][0][1]
    grown = [*messages, *conversation(5)[-2:]]
    chain = proto.DigestChain(messages)
    delta = {
        **task,
        "base": len(messages),
        "base_digest": chain.digest(len(messages)),
        "append": grown[len(messages) :],
        "view": "patch",
        "patch_base": receiver.token,
    }
    second = delta_daemon.call("truncated_messages", delta)
    assert second.result is not None
    again = second.result["patch"]
    assert (again["reuse"], again["overrides"], again["dropped"]) == (True, [], [])
    plain = delta_daemon.call("truncated_messages", {**task, "messages": grown})
    assert plain.result is not None
    assert receiver.apply(grown, again) == plain.result["messages"]
    stale = {**delta, "base": len(grown), "append": [], "patch_base": b"not-the-last-one"}
    stale["base_digest"] = proto.DigestChain(grown).digest(len(grown))
    third = delta_daemon.call("truncated_messages", stale)
    assert third.result is not None
    assert "reuse" not in third.result["patch"]
    assert [2, 4, 6] == [origin for origin, _ in third.result["patch"]["overrides"]]


@pytest.mark.parametrize("timeout", [-0.5, float("nan")], ids=["negative", "nan"])
def test_a_timeout_of_no_time_is_a_timeout_on_every_path(tmp_path: Path, timeout: float) -> None:
    """Negative and NaN timeouts raise RequestTimeoutError at once, on a client and a handle."""
    with FakeRouter(tmp_path, lambda request: []) as silent, Client(silent.endpoint) as client:
        with pytest.raises(RequestTimeoutError):
            client.ping(timeout=timeout)
        with pytest.raises(RequestTimeoutError):
            client.task("no-time").truncated_messages(conversation(1), timeout=timeout)


def test_the_cap_counts_what_a_history_holds_not_its_encoding(tmp_path: Path) -> None:
    """1,000 two-character messages: 25 KB encoded, about 1 MiB held; a 1 MiB cap keeps one.

    Counted by encoding (as before), both histories fitted a 1 MiB cap and
    a million such messages took 50 times the cap (bench/memory.py).
    """
    messages = [
        {"role": "user" if index % 2 == 0 else "assistant", "content": "ok"}
        for index in range(1000)
    ]
    assert sum(len(proto.pack(message)) for message in messages) < 30_000
    with (
        DaemonProcess(tmp_path, "--history-cache-mb", "1") as daemon,
        Client(daemon.endpoint) as client,
    ):
        first, second = client.task("held-a"), client.task("held-b")
        first.truncated_messages(messages)
        held = client.stats()["history_bytes"]
        assert held >= 800 * len(messages)  # a share per message, besides the bytes
        second.truncated_messages(messages)
        assert first.inspect()["history"] is None  # evicted: both do not fit
        assert second.inspect()["history"] == len(messages)
        assert client.stats()["history_bytes"] == held
