"""Where a delta-synced turn's time goes: each piece of a turn timed alone, in process.

The corpus conversation is replayed turn by turn through the code a turn runs
on each side, without the sockets in between: the client's handle (turn
taking, list copy, request built and checked, prefix scan and digests of the
new messages, encoding; then the reply decoded, the view rebuilt from the
patch, the record of what was sent), and the daemon's request path (envelope
decoded, arguments checked, kept history brought in step, engine, view patch
and reuse of earlier overrides, reply encoded). Stopped before turn ``--turn``
(default: the last), every piece is run alone ``--repeat`` times on that
turn's real inputs, and its median reported. The actor hop is timed on a real
``ActorSystem`` in an asyncio loop (a ``tell`` from the event loop to the
reply, with an op that does nothing, against the same loop's bare
``call_soon``).

Usage: ``.venv/bin/python -m bench.turn_parts [--window 200k|64k|big] [--corpus PATH]
[--json]``; the corpus folder (or the conversation's file) is ``--corpus`` or else
``CTXWIN_CORPUS``.
The pieces are the code as it is; what each costs alone does not add up to a
turn exactly (caches are warm here, and a real turn pays the event loop and
libzmq's threads: ``bench.turns --floor`` measures the whole).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from bench._conversation import build_conversation
from bench._corpus import CLINE_TASK, add_corpus_option, corpus_file
from bench.turns import BIG_MODEL, WINDOWS, UsageModel
from ctxwin import engine, proto
from ctxwin.client import Client, _core, _ops
from ctxwin.daemon._actors import ActorSystem, Counters
from ctxwin.daemon._kept import HistoryCache, KeptHistory
from ctxwin.daemon._ops import run_task_op
from ctxwin.daemon._tokens import TokenCounter
from ctxwin.daemon.store import FileStore

_decode_request = proto.decode_request_parts
_encode_result = proto.result_encoder()

Message = dict[str, Any]
SYNC = "daemon: kept history brought in step (History.apply: cut, append, pairs)"
SYNC_SETTLE = "daemon: history brought in step, then settled"
SETTLE = "daemon: new messages hashed after the reply is out (KeptHistory.settle)"
SYNC_ENGINE = "daemon: history brought in step, then the engine"
ENGINE = "daemon: engine prepare_request on the kept history (view built on the last)"
DECODE = "client: reply decoded (decode_reply)"
DECODE_FINISH = "client: reply decoded, then finished"
FINISH = "client: view rebuilt + sent recorded (finish: PatchReceiver.apply, DeltaSender.sent)"
SENDING = "client: new messages hashed while the reply is awaited (Call.sending)"
SENT = "client: the record of what was sent, hashing it all itself (DeltaSender.sent alone)"


def settle(kept: KeptHistory) -> None:
    """``KeptHistory.settle`` where the tree has it (earlier ones hashed in ``_sync``)."""
    hook = getattr(kept, "settle", None)
    if hook is not None:
        hook()


def timed_all(
    functions: dict[str, Callable[[], object]], repeat: int, inner: int = 10
) -> dict[str, float]:
    """Median microseconds of one call of each function, over ``repeat`` batches of ``inner``.

    The functions take turns batch by batch, so that all see the same load.
    """
    for function in functions.values():
        function()
    samples: dict[str, list[float]] = {name: [] for name in functions}
    clock = time.perf_counter_ns
    for _ in range(repeat):
        for name, function in functions.items():
            started = clock()
            for _ in range(inner):
                function()
            samples[name].append((clock() - started) / inner / 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


class Loopback:
    """One task's client handle and the daemon's request path, joined without sockets."""

    def __init__(self, model: proto.Model) -> None:
        self.model = model
        self.client = Client("ipc:///nonexistent/turn-parts.sock")  # never connects
        self.handle = self.client.task("turn-parts")
        self.state = engine.TaskState()
        self.kept = KeptHistory(
            task="turn-parts", cache=HistoryCache(1 << 40), tokens=TokenCounter("cl100k_base")
        )
        self.limits = proto.Limits()
        self.ids = 0

    def client_request(
        self, messages: list[Message], previous: proto.Usage | None
    ) -> tuple[list[Message], _core.Call[Any], bytes]:
        snapshot = list(messages)
        call = _ops.prepare_request(
            self.handle.id, (), self.model, previous_request=previous, ephemeral=None
        )
        delta = self.handle._delta.call(call, snapshot, proto.FEATURES)
        self.ids += 1
        return snapshot, delta, _core.encode(delta, self.ids)

    def sync(self, args: dict[str, Any]) -> engine.History:
        """The kept history's ``_sync`` for a handle's requests."""
        history = self.kept._sync(args)
        assert history is not None
        return history

    def engine_call(self, history: engine.History, args: dict[str, Any]) -> dict[str, Any]:
        # With the kept history's view cache, as the task's session lends it for an op: the
        # view is built on the last one.
        self.state.cache = history.cache
        try:
            return run_task_op(
                self.state, "prepare_request", {**args, "messages": history.messages}
            )
        finally:
            self.state.cache = None

    def patch(
        self, result: dict[str, Any], history: engine.History, args: dict[str, Any]
    ) -> dict[str, Any]:
        reused = self.kept.patches.of_history(
            result["messages"],
            history,
            self.state.deleted_range,
            args.get("patch_base"),
            prepend=args.get("view") == "patch_prepend",
        )
        assert reused is not None
        answer = {key: value for key, value in result.items() if key != "messages"}
        answer["patch"] = reused
        return answer

    def daemon(self, body: bytes) -> bytes:
        request_id, op, args = _decode_request(body, self.limits)
        proto.validate_args(op, args)
        history = self.sync(args)
        result = self.engine_call(history, args)
        reply = _encode_result(request_id, self.patch(result, history, args))
        settle(self.kept)  # as the actor does once the reply is out
        return reply

    def finish(self, call: _core.Call[Any], reply_body: bytes) -> dict[str, Any]:
        sending = getattr(call, "sending", None)  # (trees before it: hashed in finish)
        if sending is not None:
            sending()  # as the transport does, once the request is out
        reply = _core.decode([reply_body])
        assert reply is not None
        return cast(dict[str, Any], _core.outcome(call, reply, 0, self.client.retry, 30.0))


def actor_hop(repeat: int) -> dict[str, float]:
    """Microseconds from a ``tell`` on the event loop to its reply, against a bare ``call_soon``."""

    async def measure() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []

        def spawn(function: Callable[[], Any]) -> None:
            tasks.append(loop.create_task(function()))

        with tempfile.TemporaryDirectory() as temp:
            system = ActorSystem(
                store=FileStore(Path(temp), engine.DEFAULT_NOTICES),
                notices=engine.DEFAULT_NOTICES,
                mailbox_size=64,
                debounce_ms=500,
                debounce_max_ms=2000,
                idle_timeout=600,
                spawn=spawn,
                counters=Counters(),
                tokens=TokenCounter("cl100k_base"),
                history_cache_bytes=1 << 30,
            )
            actor = system.actor_for("hop", ephemeral=True)
            hops: list[float] = []
            soons: list[float] = []

            class Reply:
                def __init__(self, started: int, done: asyncio.Future[None]) -> None:
                    self.started, self.done = started, done

                def set_result(self, result: dict[str, Any]) -> None:
                    hops.append((time.perf_counter_ns() - self.started) / 1000)
                    self.done.set_result(None)

                def set_exception(self, exc: BaseException) -> None:
                    self.done.set_exception(exc)

            # Started by a checkpoint restore (an inspect of a task that holds nothing, or a
            # rollback of it without a range, would close it).
            await actor.ask("rollback", {"task": "hop", "ts": 0, "deleted_range": None})
            for _ in range(repeat):
                done: asyncio.Future[None] = loop.create_future()
                actor.tell(
                    "rollback", {"task": "hop", "ts": 0}, Reply(time.perf_counter_ns(), done)
                )
                await done
                soon: asyncio.Future[None] = loop.create_future()
                started = time.perf_counter_ns()

                def fire(started: int = started, soon: asyncio.Future[None] = soon) -> None:
                    soons.append((time.perf_counter_ns() - started) / 1000)
                    soon.set_result(None)

                loop.call_soon(fire)
                await soon
            actor.stop()
            await actor.done.wait()
            for task in tasks:
                await task
        return {
            "tell_to_reply_us": statistics.median(hops),
            "call_soon_us": statistics.median(soons),
        }

    return asyncio.run(measure())


def breakdown(window: str, turn: int | None, repeat: int, source: Path | None) -> dict[str, Any]:
    """Replay the corpus (or the 10 MB conversation) to a turn, then time each piece alone;
    ``source`` the real conversation's file (unused for ``big``)."""
    if window == "big":
        corpus = build_conversation(20_000, 10_000_000, seed=0)
        model = BIG_MODEL
    else:
        assert source is not None, "a window of the corpus needs its file"
        corpus = cast(list[Message], json.loads(source.read_text()))
        model = WINDOWS[window]
    loop = Loopback(model)
    usage = UsageModel()
    previous: proto.Usage | None = None
    ts = 1_767_225_600_000
    history: list[Message] = []
    ends = list(range(1, len(corpus) + 1, 2))
    stop = ends[-1] if turn is None else ends[turn]
    cut_turns = 0
    for end in ends:
        history.extend(corpus[len(history) : end])
        if end == stop:
            break
        snapshot, call, body = loop.client_request(history, previous)
        result = loop.finish(call, loop.daemon(body))
        cut_turns += bool(result["range_updated"])
        ts += 17_000
        previous = usage.after(result["messages"], ts)
    # The turn to take apart: its real inputs on both sides.
    gc.collect()
    snapshot, call, body = loop.client_request(history, previous)
    request_id, op, args = _decode_request(body, loop.limits)
    kept = loop.sync(args)
    result = loop.engine_call(kept, args)
    assert not result["range_updated"], "pick a turn that does not cut"
    patches = loop.kept.patches
    saved = {name: getattr(patches, name) for name in ("_last", "_token", "_serial")}
    unchanged = getattr(kept, "_unchanged", None)  # the kept history's mark of changes
    answer = loop.patch(result, kept, args)
    reply_body = _encode_result(request_id, answer)
    handle = loop.handle
    sender = handle._delta.sender
    base_call = _ops.prepare_request(handle.id, (), model, previous_request=previous)

    def reset_actor() -> None:
        for name, value in saved.items():
            setattr(patches, name, value)
        if unchanged is not None:
            kept._unchanged = unchanged

    def sync_and_settle() -> None:
        loop.sync(args)
        settle(loop.kept)

    def sync_and_engine() -> None:
        loop.engine_call(loop.sync(args), args)

    def patch_alone() -> None:
        reset_actor()
        loop.patch(result, kept, args)

    def take_turn() -> None:
        with handle._syncing.take(base_call, handle.client):
            pass

    def client_call_turn() -> None:
        budget = _core.budget(loop.client.timeout)
        time.monotonic()
        with loop.client._wire.turn("ping", budget):
            pass

    def sending() -> None:
        hook = getattr(call, "sending", None)
        if hook is not None:
            hook()

    def decode_and_finish() -> None:
        loop.finish(call, reply_body)  # hashes first, as the transport does

    def decode_alone() -> None:
        _core.decode([reply_body])

    pieces: dict[str, Callable[[], object]] = {
        "client: handle turn taken and released (_turn, Turns.take)": take_turn,
        "client: list copy of the history (snapshot)": lambda: list(history),
        "client: request built and checked without messages (_ops.prepare_request)": lambda: (
            _ops.prepare_request(handle.id, (), model, previous_request=previous)
        ),
        "client: prefix scan + digests of the rechecked tail (args_for)": lambda: sender.args_for(
            snapshot
        ),
        "client: delta request built and checked again (DeltaSync.call)": lambda: (
            handle._delta.call(base_call, snapshot, proto.FEATURES)
        ),
        "client: client call's own turn (Client.call, Turns.take)": client_call_turn,
        "client: request encoded (_core.encode)": lambda: _core.encode(call, 7),
        "daemon: envelope decoded (_decode_request)": lambda: _decode_request(body, loop.limits),
        "daemon: arguments checked (validate_args)": lambda: proto.validate_args(op, args),
        SYNC: lambda: loop.sync(args),
        SYNC_SETTLE: sync_and_settle,
        SYNC_ENGINE: sync_and_engine,
        "daemon: view patch + reuse of overrides (PatchMaker.of_history)": patch_alone,
        "daemon: reply encoded (_encode_result)": lambda: _encode_result(request_id, answer),
        DECODE: decode_alone,
        DECODE_FINISH: decode_and_finish,
        SENDING: sending,
        SENT: lambda: sender.sent(snapshot, {k: call.args[k] for k in ("base", "base_digest")}),
    }
    measured = timed_all(pieces, repeat)
    parts: dict[str, float] = {}
    for name, micros in measured.items():
        if name == SYNC_SETTLE:
            parts[SETTLE] = micros - measured[SYNC]
        elif name == SYNC_ENGINE:
            parts[ENGINE] = micros - measured[SYNC]
        elif name == DECODE_FINISH:
            parts[FINISH] = micros - measured[DECODE] - measured.get(SENDING, 0.0)
        else:
            parts[name] = micros
    hop = actor_hop(max(200, repeat * 10))
    return {
        "window": window,
        "history_messages": len(history),
        "view_messages": len(result["messages"]),
        "appended": len(args.get("append", ())),
        "request_bytes": len(body),
        "reply_bytes": len(reply_body),
        "cut_turns_before": cut_turns,
        "parts_us": parts,
        "sum_of_parts_us": sum(parts.values()) - parts[SENT],
        "actor_hop": hop,
    }


def scan_slope(repeat: int) -> dict[str, float]:
    """The prefix scan's cost (``DeltaSender.args_for`` after two appends) per 1000 messages.

    Measured on the 10 MB conversation's prefixes of 2000 to 20000 messages,
    the share of a turn's cost that grows with the history by design.
    """
    messages = build_conversation(20_000, 10_000_000, seed=0)
    points: dict[str, float] = {}
    for length in (2_000, 5_000, 10_000, 15_000, 20_000):
        history = messages[: length - 2]
        sender = proto.DeltaSender()
        sender.sent(history, sender.args_for(history))
        history = messages[:length]
        scan = functools.partial(sender.args_for, history)
        points[str(length)] = timed_all({"scan": scan}, repeat, 2)["scan"]
    lengths = [int(n) for n in points]
    times = list(points.values())
    mean_x, mean_y = statistics.fmean(lengths), statistics.fmean(times)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(lengths, times, strict=True)) / sum(
        (x - mean_x) ** 2 for x in lengths
    )
    return {
        **{f"args_for_us_at_{n}": t for n, t in points.items()},
        "slope_us_per_1000": slope * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--window",
        choices=[*sorted(WINDOWS), "big"],
        default="200k",
        help="the corpus at a window, or big: the 10 MB synthetic conversation at 1M",
    )
    parser.add_argument("--turn", type=int, default=None, help="turn index (default: the last)")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--scan-slope", action="store_true", help="the prefix scan's cost per 1000 messages"
    )
    add_corpus_option(parser, CLINE_TASK)
    options = parser.parse_args(argv)
    if options.scan_slope:
        print(json.dumps(scan_slope(options.repeat), indent=2))
        return 0
    source = None if options.window == "big" else corpus_file(options.corpus, CLINE_TASK)
    report = breakdown(options.window, options.turn, options.repeat, source)
    if options.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"window {report['window']}: history {report['history_messages']} messages, view "
        f"{report['view_messages']}, {report['appended']} appended, request "
        f"{report['request_bytes']} B, reply {report['reply_bytes']} B"
    )
    for name, micros in report["parts_us"].items():
        print(f"{micros:8.2f} us  {name}")
    print(f"{report['sum_of_parts_us']:8.2f} us  sum")
    hop = report["actor_hop"]
    print(
        f"actor hop: tell to reply {hop['tell_to_reply_us']:.1f} us, "
        f"bare call_soon {hop['call_soon_us']:.1f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
