"""Hypothesis end to end: random frames, envelopes, types, sizes and task ids at the daemon.

Usage (from the repository root)::

    .venv/bin/python -m bench.reliability.fuzz [--quick] [--examples 3000] [--seed N] [--json]

One daemon (``--max-bytes 65536``, 8 frames) serves the whole run. Each
example is one multipart message sent on a DEALER socket (a fresh one after
the daemon dropped the connection): random bytes,
random msgpack values, request envelopes with every field fuzzed (version,
id, op, args of any type, known argument names with random values, task ids
such as ``../x``, ``.``, empty, 200 characters, non-ASCII), plausible requests
for every op, nesting past the depth msgpack allows, frames over the size cap
and messages over the frame or byte caps, with or without an empty delimiter.

After each example: a message with a frame over the size cap gets no reply
(the connection is dropped); every other message gets exactly one reply
within 5 s that decodes as a reply envelope; a separate client's ``ping`` is
answered; the daemon process is alive. At the end no file exists outside the
state dir's task directories, and every task directory name is a valid task id.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
import zmq
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from bench.reliability._harness import MODEL, Client, Daemon, arguments, finish, machine, scratch
from ctxwin import proto
from tests._strategies import msgpack_values

MAX_BYTES = 65536
MAX_FRAMES = 8

values = msgpack_values(text=40, items=5, leaves=30)
task_ids = st.sampled_from(
    [
        "../x",
        "..",
        ".",
        "",
        "a" * 129,
        "/etc/passwd",
        "a/b",
        "-x",
        "é",
        "x\x00y",
        "ok-task",
        "A.b_c-9",
    ]
) | st.text(max_size=20)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", 3]),
            "content": st.text(max_size=50)
            | st.lists(
                st.fixed_dictionaries(
                    {
                        "type": st.sampled_from(["text", "tool_use", "x"]),
                        "text": st.text(max_size=30),
                    }
                ),
                max_size=3,
            )
            | values,
        }
    ),
    max_size=8,
)
arg_values = {
    "task": task_ids,
    "messages": messages | values,
    "model": st.fixed_dictionaries(
        {"id": st.text(max_size=10), "context_window": st.integers(-5, 10**9)}
    )
    | values,
    "ts": st.integers(-5, 2**40) | values,
    "deleted_range": st.lists(st.integers(-3, 50), max_size=3) | st.none() | values,
    "keep": st.sampled_from(["half", "quarter", "none", "all"]) | values,
    "usage": st.dictionaries(
        st.sampled_from(["ts", "tokens_in", "tokens_out", "cache_writes", "cache_reads"]),
        st.integers(-5, 10**7) | values,
    ),
    "text": st.text(max_size=60) | values,
    "threshold": st.floats() | values,
    "ephemeral": st.booleans() | values,
}
known_args = st.dictionaries(
    st.sampled_from(sorted(arg_values)), st.just(None), max_size=6
).flatmap(lambda keys: st.fixed_dictionaries({key: arg_values[key] for key in keys}))
ops = st.sampled_from(sorted(proto.OPS)) | st.text(max_size=20)
envelopes = st.fixed_dictionaries(
    {
        "v": st.just(1) | values,
        "id": st.integers(0, 2**31) | values,
        "op": ops | values,
        "args": known_args | values,
    },
    optional={"extra": values},
)


def _deep(depth: int) -> bytes:
    """count_tokens with a tool_use input nested ``depth`` arrays deep (packed by hand:
    the packer refuses such depth)."""
    head = msgpack.packb({"v": 1, "id": 1, "op": "count_tokens"})
    block = msgpack.packb({"type": "tool_use", "id": "1", "name": "n"})
    return (
        bytes([head[0] + 1])
        + head[1:]
        + msgpack.packb("args")
        + b"\x81"
        + msgpack.packb("messages")
        + b"\x91\x82"
        + msgpack.packb("role")
        + msgpack.packb("assistant")
        + msgpack.packb("content")
        + b"\x91"
        + bytes([block[0] + 1])
        + block[1:]
        + msgpack.packb("input")
        + b"\x91" * depth
        + msgpack.packb("x")
    )


def _plausible(op: str, task: str) -> bytes:
    args: dict[str, Any] = {
        "task": task,
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        "model": MODEL,
        "ts": 1,
        "keep": "half",
        "deleted_range": None,
        "usage": {"ts": 1, "tokens_in": 1},
        "text": "hi",
    }
    spec = proto.OPS[op]
    wanted = set(spec.required) | ({spec.one_of[0][0]} if spec.one_of else set())
    return proto.encode_request(7, op, {key: args[key] for key in wanted})


bodies = st.one_of(
    st.binary(max_size=200),
    values.map(lambda value: msgpack.packb(value, use_bin_type=True)),
    envelopes.map(lambda value: msgpack.packb(value, use_bin_type=True)),
    st.builds(_plausible, st.sampled_from(sorted(proto.OPS)), task_ids),
    st.integers(400, 1500).map(_deep),
    st.integers(MAX_BYTES + 1, MAX_BYTES + 4096).map(lambda size: b"\x00" * size),
    st.integers(MAX_BYTES // 2, MAX_BYTES).map(lambda size: b"\x91" + b"\x00" * (size - 1)),
)
# A frame over the cap in a message of several frames makes the *sending* process's
# libzmq 4.3.5 abort ("Resource temporarily unavailable (src/session_base.cpp:233)")
# when the daemon drops the connection mid-message; the daemon survives, the fuzzer
# would not. So frames over the cap are sent alone.
small_bodies = bodies.filter(lambda body: len(body) <= MAX_BYTES)
frame_lists = st.one_of(
    bodies.map(lambda body: [body]),
    small_bodies.map(lambda body: [b"", body]),
    st.lists(small_bodies, min_size=2, max_size=4),
    st.integers(MAX_FRAMES + 1, 40).map(lambda count: [b"f"] * count),
)


class Fuzzer:
    """Sends examples to one daemon and checks what comes back."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.probe = Client(daemon.endpoint, self.context)
        self.sender = Client(daemon.endpoint, self.context)
        self.outcomes: Counter[str] = Counter()
        self.failures: list[str] = []
        self.examples = 0

    def check(self, frames: list[bytes]) -> None:
        self.examples += 1
        # One socket while the daemon keeps the connection; a fresh one after it drops it.
        sock = self.sender.sock
        sock.send_multipart(frames)
        if any(len(frame) > MAX_BYTES for frame in frames):
            self.outcomes["dropped (frame over cap)"] += 1
            self.sender.reset()
        elif not sock.poll(5000):
            self._fail(frames, "no reply within 5 s")
            self.sender.reset()
        else:
            reply = sock.recv_multipart()
            try:
                decoded = proto.decode_reply(reply[-1])
            except proto.ProtocolError as exc:
                self._fail(frames, f"undecodable reply: {exc}")
            else:
                self.outcomes["ok" if decoded.ok else str(decoded.code)] += 1
        try:
            if not self.probe.call("ping", timeout=5).ok:
                self._fail(frames, "ping refused")
        except TimeoutError:
            self._fail(frames, "ping not answered")
            self.probe.reset()
        if not self.daemon.alive():
            self._fail(frames, "daemon exited")
            raise AssertionError("daemon exited")

    def _fail(self, frames: list[bytes], what: str) -> None:
        sample = [frame[:60] for frame in frames[:3]]
        self.failures.append(f"{what}: {sample!r}")

    def close(self) -> None:
        self.probe.close()
        self.sender.close()
        self.context.term()


def strays(root: Path) -> list[str]:
    """Files under ``root`` that a fuzzed request may have put where it must not."""
    expected = {"ctxwind.log", "run", "state"}
    found = [name for name in os.listdir(root) if name not in expected]
    tasks = root / "state" / "tasks"
    for entry in os.listdir(root / "state"):
        if entry not in ("tasks", "ctxwind.lock"):
            found.append(f"state/{entry}")
    if tasks.is_dir():
        found += [f"state/tasks/{n}" for n in os.listdir(tasks) if not proto.is_valid_task_id(n)]
    return found


def run(examples: int, seed_value: int) -> dict[str, Any]:
    """The fuzz run; the summary with ``passed``."""
    started = time.monotonic()
    with scratch("ctxwin-fuzz-") as root:
        daemon = Daemon(
            root,
            "--max-bytes",
            str(MAX_BYTES),
            "--max-frames",
            str(MAX_FRAMES),
            "--log-level",
            "warning",
        )
        daemon.start()
        fuzzer = Fuzzer(daemon)
        error: str | None = None
        try:

            @seed(seed_value)
            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(frame_lists)
            def property_holds(frames: list[bytes]) -> None:
                fuzzer.check(frames)

            try:
                property_holds()
            except Exception as exc:
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
            found = strays(root)
            tasks = len(os.listdir(daemon.state_dir / "tasks"))
        finally:
            fuzzer.close()
            code = daemon.stop()
    passed = error is None and not fuzzer.failures and not found and code == 0
    return {
        "machine": machine(),
        "examples": fuzzer.examples,
        "seed": seed_value,
        "seconds": round(time.monotonic() - started, 1),
        "outcomes": dict(fuzzer.outcomes.most_common()),
        "failures": fuzzer.failures[:10],
        "error": error,
        "task_dirs_created": tasks,
        "files_outside_task_dirs": found,
        "stop_code": code,
        "passed": passed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--quick", action="store_true", help="300 examples")
    parser.add_argument("--examples", type=int, default=3000, help="hypothesis examples (3000)")
    parser.add_argument("--seed", type=int, default=8, help="hypothesis seed (8)")
    args = parser.parse_args(argv)
    summary = run(300 if args.quick else args.examples, args.seed)
    return finish("fuzz", summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
