"""What a kept history really holds: the daemon's resident memory per history byte.

The daemon keeps each task's history for delta sync under ``history_cache_mb``.
This bench measures, for histories of several shapes, how much the daemon's
resident set (``VmRSS``) grows when it keeps one, against the history's
canonical encoded size (each message's msgpack encoding, as the digest
chain counts it) and the size the cache charges for it (``stats``'
``history_bytes``). Each shape runs in a fresh daemon:
one small warm-up request, the RSS read, one ``truncated_messages`` with
``view: "patch"`` (which keeps the history), then the RSS read again once the
digests are settled.

Shapes: ``tiny`` (200,000 messages of two characters, the worst case),
``blocks`` (50,000 messages of two 40-character text blocks), ``corpus``
(a real Cline conversation, the corpus's ``mra-api_conversation_history.json``,
read by path and repeated 8 times), and ``tiny-anthropic`` (the tiny shape in
the Anthropic dialect, whose internal form is kept too). The corpus folder is
given by ``--corpus FOLDER`` or ``CTXWIN_CORPUS``; without either, measure the
other shapes with ``--shape``.

Run::

    CTXWIN_CORPUS=../shared/corpus .venv/bin/python -m bench.memory   # table, median of 3 runs
    .venv/bin/python -m bench.memory --corpus FOLDER --repeat 1 --json  # the corpus folder
    .venv/bin/python -m bench.memory --shape tiny --shape blocks      # no corpus needed
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from bench._corpus import CLINE_TASK, add_corpus_option, corpus_file
from bench.wire import start_daemon, wait_ready
from ctxwin import proto


def _alternating(count: int, content: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user" if index % 2 == 0 else "assistant", "content": content}
        for index in range(count)
    ]


def shapes(corpus: Path | None) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Name -> (dialect, messages); ``corpus`` the real conversation's file, if measured."""
    block = {"type": "text", "text": "x" * 40}
    found: dict[str, tuple[str, list[dict[str, Any]]]] = {
        "tiny": ("cline", _alternating(200_000, "ok")),
        "blocks": ("cline", _alternating(50_000, [block, block])),
        "tiny-anthropic": ("anthropic", _alternating(200_000, "ok")),
    }
    if corpus is not None:
        messages = json.loads(corpus.read_text())
        found["corpus"] = ("cline", messages[:2] + messages[2:] * 8)
    return found


def rss_bytes(pid: int) -> int:
    """The process's resident set (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def call(endpoint: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
    """One request; the result (fails on an error reply)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(proto.encode_request(1, op, args))
        if not sock.poll(600_000):
            raise TimeoutError(op)
        reply = proto.decode_reply(sock.recv())
    finally:
        sock.close(linger=0)
    if not reply.ok or reply.result is None:
        raise RuntimeError(f"{op}: {reply.code}: {reply.message}")
    return reply.result


def measure(dialect: str, messages: list[dict[str, Any]]) -> dict[str, float]:
    """RSS growth for keeping ``messages`` in a fresh daemon, and what the cache counts."""
    with tempfile.TemporaryDirectory(prefix="ctxwin-mem-") as root:
        endpoint = f"ipc://{root}/d.sock"
        daemon = start_daemon(
            endpoint,
            Path(root) / "state",
            "--history-cache-mb",
            "100000",
            "--max-messages",
            "10000000",
        )
        try:
            wait_ready(endpoint)
            warm = {"task": "warm", "dialect": dialect, "view": "patch"}
            call(endpoint, "truncated_messages", {**warm, "messages": messages[:2]})
            time.sleep(0.5)
            before = rss_bytes(daemon.pid)
            args = {"task": "kept", "dialect": dialect, "view": "patch", "messages": messages}
            call(endpoint, "truncated_messages", args)
            time.sleep(1.0)  # the digests are settled after the reply
            stats = call(endpoint, "stats", {})
            after = rss_bytes(daemon.pid)
        finally:
            daemon.terminate()
            daemon.wait(60)
    encoded = float(sum(len(proto.pack(message)) for message in messages))
    return {
        "messages": float(len(messages)),
        "encoded": encoded,
        "charged": float(stats["history_bytes"]),
        "rss_growth": float(after - before),
    }


def run(
    repeat: int, only: list[str] | None = None, corpus: Path | None = None
) -> dict[str, dict[str, float]]:
    """Median figures per shape over ``repeat`` runs (the shapes in turn); ``corpus`` the
    real conversation's file (None: that shape is not measured)."""
    runs: dict[str, list[dict[str, float]]] = {}
    table = shapes(corpus)
    names = [name for name in table if not only or name in only]
    for _ in range(repeat):
        for name in names:
            runs.setdefault(name, []).append(measure(*table[name]))
    result: dict[str, dict[str, float]] = {}
    for name, samples in runs.items():
        figures = {key: statistics.median(s[key] for s in samples) for key in samples[0]}
        figures["rss_per_encoded_byte"] = figures["rss_growth"] / figures["encoded"]
        figures["rss_per_charged_byte"] = figures["rss_growth"] / figures["charged"]
        figures["rss_per_message"] = figures["rss_growth"] / figures["messages"]
        result[name] = figures
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shape", action="append", help="only these shapes")
    parser.add_argument("--json", action="store_true")
    add_corpus_option(parser, CLINE_TASK)
    args = parser.parse_args(argv)
    needed = not args.shape or "corpus" in args.shape
    others = "--shape tiny --shape blocks --shape tiny-anthropic for the other shapes"
    source = corpus_file(args.corpus, CLINE_TASK, others) if needed else None
    result = run(args.repeat, args.shape, source)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(
        f"{'shape':<16}{'messages':>10}{'encoded MB':>12}{'charged MB':>12}{'RSS MB':>10}"
        f"{'RSS/enc':>9}{'RSS/charged':>13}{'RSS B/msg':>11}"
    )
    for name, f in result.items():
        print(
            f"{name:<16}{f['messages']:>10.0f}{f['encoded'] / 1e6:>12.2f}"
            f"{f['charged'] / 1e6:>12.2f}{f['rss_growth'] / 1e6:>10.1f}"
            f"{f['rss_per_encoded_byte']:>9.1f}{f['rss_per_charged_byte']:>13.2f}"
            f"{f['rss_per_message']:>11.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
