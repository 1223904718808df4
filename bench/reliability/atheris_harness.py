"""Coverage-guided fuzzing of the request decoder and argument validation with atheris.

Usage (from the repository root; atheris must be installed in the venv)::

    .venv/bin/pip install atheris
    .venv/bin/python -m bench.reliability.atheris_harness [--quick] [--runs 100000] [--json]

The target decodes the input with ``ctxwin.proto.decode_request`` (under
64 KiB frame limits) and, when that succeeds, checks the arguments with
``validate_args``. Both may only raise ``ProtocolError``; any other exception,
or a request that validates although its task id breaks the task id rule, is a
crash that libFuzzer reports with the input that caused it. The corpus starts
from a valid request of every op (written to a temp dir); every loaded Python
function (``ctxwin.proto`` among them) is instrumented for coverage. The
wrapper runs libFuzzer in a child process and reports runs, time, coverage and
crashes.
"""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.reliability._harness import MODEL, REPO, arguments, conversation, finish, machine

LIMITS_BYTES = 64 * 1024

SEEDS: dict[str, dict[str, Any]] = {
    "ping": {},
    "stats": {},
    "context_window_info": {"model": MODEL},
    "should_compact": {"usage": {"ts": 1, "tokens_in": 10}, "model": MODEL, "threshold": 0.5},
    "next_truncation_range": {"messages": conversation(2), "deleted_range": None, "keep": "half"},
    "prepare_request": {
        "task": "t1",
        "messages": conversation(2),
        "model": MODEL,
        "previous_request": {"ts": 1, "tokens_in": 5},
    },
    "truncated_messages": {"task": "t1", "messages": conversation(2), "deleted_range": [2, 3]},
    "optimize_file_reads": {"task": "t1", "messages": conversation(2), "ts": 3},
    "optimize_file_reads_in_memory": {"task": "t1", "messages": conversation(2), "ts": 3},
    "compact_subagent": {"task": "t1", "messages": conversation(2)},
    "apply_truncation_notice": {"task": "t1", "ts": 1, "messages": conversation(2)},
    "compact": {"task": "t1", "messages": conversation(2), "keep": "quarter", "ts": 1},
    "condensed": {"task": "t1", "messages": conversation(2)},
    "rollback": {"task": "t1", "ts": 1, "deleted_range": None},
    "inspect": {"task": "t.1-x_y"},
    "flush": {"task": "t1"},
    "close": {"task": "t1"},
    "count_tokens": {"text": "hello"},
}


def write_corpus(directory: Path) -> int:
    """A valid request of every op, one file each; returns the count."""
    from ctxwin import proto

    for index, (op, args) in enumerate(SEEDS.items()):
        (directory / f"seed-{op}").write_bytes(proto.encode_request(index, op, args))
    return len(SEEDS)


def fuzz(argv: list[str]) -> None:
    """Run libFuzzer in this process (never returns normally)."""
    atheris: Any = importlib.import_module("atheris")
    from ctxwin import proto

    # ctxwin.proto is already imported (by the harness), so instrument what is loaded.
    atheris.instrument_all()

    limits = proto.Limits(LIMITS_BYTES, 8, LIMITS_BYTES)

    def one_input(data: bytes) -> None:
        try:
            request = proto.decode_request(data, limits)
        except proto.ProtocolError:
            return
        try:
            proto.validate_args(request.op, request.args)
        except proto.ProtocolError:
            return
        task = request.args.get("task")
        if task is not None and not proto.is_valid_task_id(task):
            raise AssertionError(f"task id {task!r} passed validation")

    atheris.Setup(argv, one_input)
    atheris.Fuzz()


_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_COV = re.compile(r"cov: (\d+) ft: (\d+)")


def run(runs: int, max_len: int) -> dict[str, Any]:
    """Fuzz in a child process for ``runs`` inputs; the summary with ``passed``."""
    try:
        importlib.import_module("atheris")
    except ImportError:
        return {"passed": False, "skipped": "atheris is not installed (pip install atheris)"}
    with tempfile.TemporaryDirectory(prefix="ctxwin-atheris-") as temp:
        corpus = Path(temp) / "corpus"
        corpus.mkdir()
        seeds = write_corpus(corpus)
        started = time.monotonic()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.reliability.atheris_harness",
                "--role",
                "fuzz",
                "--",
                f"-runs={runs}",
                f"-max_len={max_len}",
                f"-artifact_prefix={temp}/",
                "-print_final_stats=1",
                str(corpus),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=3600,
            check=False,
        )
        elapsed = time.monotonic() - started
        crashes = sorted(p.name for p in Path(temp).iterdir() if p.name.startswith("crash-"))
        corpus_size = sum(1 for _ in corpus.iterdir())
    output = result.stderr + result.stdout
    done = _DONE.findall(output)
    coverage = _COV.findall(output)
    return {
        "machine": machine(),
        "runs_requested": runs,
        "runs_done": int(done[-1][0]) if done else None,
        "seconds": round(elapsed, 1),
        "seed_inputs": seeds,
        "corpus_after": corpus_size,
        "coverage_edges": int(coverage[-1][0]) if coverage else None,
        "coverage_features": int(coverage[-1][1]) if coverage else None,
        "exit_code": result.returncode,
        "crashes": crashes,
        "tail": output.strip().splitlines()[-3:] if result.returncode else [],
        "passed": result.returncode == 0 and not crashes and bool(done),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--quick", action="store_true", help="10000 runs")
    parser.add_argument("--runs", type=int, default=100_000, help="libFuzzer runs (100000)")
    parser.add_argument("--max-len", type=int, default=4096, help="largest input (4096)")
    parser.add_argument("--role", choices=("fuzz",), help=argparse.SUPPRESS)
    parser.add_argument("fuzzer_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "fuzz":
        fuzz([sys.argv[0], *args.fuzzer_args])
        return 0
    summary = run(10_000 if args.quick else args.runs, args.max_len)
    return finish("atheris", summary, args.json)


if __name__ == "__main__":
    sys.exit(main())
