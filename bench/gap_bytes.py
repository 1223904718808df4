"""Bytes per turn of an ``auto`` task whose views leave turns out of their middle.

A task with a deleted set (``auto``'s rebuilds, docs/STRATEGIES.md) has views
with gaps. A client that applies ``skip`` runs (``patch_skip``, docs/PROTOCOL.md)
gets them as patches; one from before the form gets them whole. This replays
one conversation (``bench._conversation``'s, 500 bytes a message as in its
2000-message one) turn by turn into two tasks of one real daemon, in the same
run, each request sent by delta (``base``/``base_digest``/``append``) with
``view: "patch"`` and the last patch's token, as the client library sends them:

- ``whole``: without ``patch_skip`` (an older client);
- ``skip``: with it.

Both tasks get the same requests, so they make the same decisions; the
bytes counted are each request's and reply's encoded frames. Figures are the
mean bytes per turn over all turns, and over the turns whose view had gaps.

Usage: ``.venv/bin/python -m bench.gap_bytes [--messages N] [--window TOKENS] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._conversation import build_conversation
from bench.turns import Connection, Daemon, UsageModel
from ctxwin import proto

Message = dict[str, Any]


class _Counted(Connection):
    """A DEALER connection that counts the bytes of each request and reply."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self.sent = 0
        self.received = 0

    def exchange(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self.ids)
        frame = proto.encode_request(request_id, op, args)
        self.socket.send(frame)
        self.sent = len(frame)
        if not self.socket.poll(60_000):
            raise TimeoutError(f"no reply to {op}")
        data = self.socket.recv()
        self.received = len(data)
        reply = proto.decode_reply(data)
        if not reply.ok or reply.result is None:
            raise RuntimeError(f"{op} failed: {reply.code}: {reply.message}")
        return reply.result


class _Client:
    """A task as the client library drives it, by delta and patches, counting bytes."""

    def __init__(self, connection: _Counted, task: str, skip: bool, model: proto.Model) -> None:
        self.connection = connection
        self.task = task
        self.skip = skip
        self.model = model
        self.sender = proto.DeltaSender()
        self.patches = proto.PatchReceiver()
        self.bytes: list[int] = []
        self.gapped: list[bool] = []

    def __call__(self, history: list[Message], previous: proto.Usage | None) -> list[Message]:
        delta = self.sender.args_for(history)
        args: dict[str, Any] = {
            "task": self.task,
            "model": self.model,
            "previous_request": previous,
            "strategy": "auto",
            "pricing": "anthropic",
            "view": "patch",
            **delta,
        }
        if self.patches.token is not None:
            args["patch_base"] = self.patches.token
        if self.skip:
            args["patch_skip"] = True
        self.sender.prepare(history, delta)
        result = self.connection.exchange("prepare_request", args)
        self.sender.sent(history, delta)
        patch = result.get("patch")
        if patch is not None:
            view = self.patches.apply(history, patch)
        else:
            self.patches.took_whole()
            view = result["messages"]
        self.bytes.append(self.connection.sent + self.connection.received)
        return view


def run(messages: list[Message], window: int) -> dict[str, Any]:
    """Replay ``messages`` into both tasks; the figures of each."""
    model: proto.Model = {"id": "claude-sonnet-4-5", "context_window": window}
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        (root / "run").mkdir()
        daemon = Daemon(root)
        try:
            daemon.start()  # answers ping once started
            connection = _Counted(daemon.endpoint)
            clients = {
                "whole": _Client(connection, "gaps-whole", False, model),
                "skip": _Client(connection, "gaps-skip", True, model),
            }
            usage = {name: UsageModel() for name in clients}
            previous: dict[str, proto.Usage | None] = dict.fromkeys(clients)
            views: dict[str, list[Message]] = {}
            gapped: list[bool] = []
            ts = 1_767_225_600_000
            for end in range(1, len(messages) + 1, 2):
                ts += 17_000
                history = messages[:end]
                for name, client in clients.items():
                    views[name] = client(history, previous[name])
                    previous[name] = usage[name].after(views[name], ts)
                if views["whole"] != views["skip"]:
                    raise RuntimeError(f"the two tasks' views differ at message {end}")
                inspected = connection.exchange("inspect", {"task": "gaps-skip"})
                gapped.append(bool(inspected.get("dropped")))
        finally:
            daemon.stop()
    figures: dict[str, Any] = {"turns": len(gapped), "turns_with_gaps": sum(gapped)}
    for name, client in clients.items():
        with_gaps = [size for size, gaps in zip(client.bytes, gapped, strict=True) if gaps]
        figures[name] = {
            "bytes_per_turn": round(statistics.fmean(client.bytes)),
            "bytes_per_turn_with_gaps": round(statistics.fmean(with_gaps)) if with_gaps else None,
        }
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gap_bytes", description=__doc__)
    parser.add_argument("--messages", type=int, default=600, help="messages replayed")
    parser.add_argument("--window", type=int, default=64_000, help="the model's window")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    messages = build_conversation(args.messages, target_bytes=args.messages * 500)
    figures = run(messages, args.window)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"{figures['turns']} turns, {figures['turns_with_gaps']} with gaps "
        f"({args.messages} messages, {args.window:,}-token window, strategy auto)"
    )
    for name in ("whole", "skip"):
        item = figures[name]
        print(
            f"{name:>5}: {item['bytes_per_turn']:,} bytes per turn, "
            f"{item['bytes_per_turn_with_gaps'] or 0:,} on turns with gaps"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
