"""Shared pieces of the reliability suite: daemon wrappers, clients, fault injectors, figures.

Everything here talks to the daemon over ipc (or loopback TCP) only, and every
wait is bounded by a deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from ctxwin import proto
from tests._daemon import DaemonProcess

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
HISTORY = "context_history.json"
META = "ctxwin.json"
TEMP_SUFFIX = ".tmp"
MODEL: dict[str, Any] = {"id": "claude-sonnet", "context_window": 200_000}


def conversation(turns: int = 6, text: int = 40) -> list[dict[str, Any]]:
    """A small well-formed conversation of ``2 + 2 * turns`` messages."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Add a --verbose flag."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "On it."}]},
    ]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"step {turn} " + "u" * text})
        messages.append({"role": "assistant", "content": f"done {turn} " + "a" * text})
    return messages


# -- the daemon -------------------------------------------------------------------


class Daemon(DaemonProcess):
    """A ctxwind subprocess with an optional command prefix and the default endpoint.

    Args:
        root: directory holding ``run/``, ``state/`` and the log.
        extra_args: more ``ctxwind`` flags.
        env: environment additions; a value of None removes the variable.
        preexec_fn: run in the child before exec (e.g. ``setrlimit``).
        prefix: a wrapper command that execs the daemon in place (``setpriv``,
            ``capsh``), so the process id stays the daemon's.
        default_endpoint: pass no ``--endpoint``; the daemon picks the default
            from ``XDG_RUNTIME_DIR`` or ``TMPDIR`` in ``env``.
    """

    def __init__(
        self,
        root: Path,
        *extra_args: str,
        env: Mapping[str, str | None] | None = None,
        preexec_fn: Callable[[], None] | None = None,
        prefix: Sequence[str] = (),
        default_endpoint: bool = False,
    ) -> None:
        added = {name: value for name, value in (env or {}).items() if value is not None}
        super().__init__(root, *extra_args, env=added, preexec_fn=preexec_fn)
        for name, value in (env or {}).items():
            if value is None:  # before the default endpoint is read from the environment
                self.env.pop(name, None)
        self.prefix = list(prefix)
        self.default_endpoint = default_endpoint
        if default_endpoint:
            runtime = self.env.get("XDG_RUNTIME_DIR")
            if runtime:
                directory = Path(runtime) / "ctxwin"
            else:
                temp = self.env.get("TMPDIR", tempfile.gettempdir())
                directory = Path(temp) / f"ctxwin-{os.getuid()}"
            self.runtime_dir = directory
            self.endpoint = f"ipc://{directory / 'ctxwind.sock'}"

    @property
    def argv(self) -> list[str]:
        argv = super().argv
        if self.default_endpoint:
            at = argv.index("--endpoint")
            del argv[at : at + 2]
        return [*self.prefix, *argv]

    @property
    def pid(self) -> int:
        """The daemon's process id (it must be running)."""
        assert self.proc is not None, "daemon not running"
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the daemon process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log events called ``name`` so far."""
        found = []
        for line in self.log().splitlines():
            if f'"{name}"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == name:
                found.append(event)
        return found

    def wait_for_event(self, name: str, timeout: float = 10.0, **fields: object) -> dict[str, Any]:
        """The first log event ``name`` whose fields contain ``fields`` (polled to a deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events(name):
                if all(
                    (str(value) in str(event.get(key)))
                    if key == "error"
                    else event.get(key) == value
                    for key, value in fields.items()
                ):
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {name} event with {fields} in:\n{self.log()[-4000:]}")
            time.sleep(0.02)


# -- clients ----------------------------------------------------------------------


class Client:
    """A DEALER socket to the daemon, closed with linger 0."""

    def __init__(
        self, endpoint: str, context: zmq.Context[zmq.Socket[bytes]] | None = None
    ) -> None:
        self.endpoint = endpoint
        self.context: zmq.Context[zmq.Socket[bytes]] = context or zmq.Context.instance()
        self.sock = self._socket()
        self.next_id = 1

    def _socket(self) -> zmq.Socket[bytes]:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        return sock

    def reset(self) -> None:
        """Drop the socket (and anything queued on it) and connect a fresh one."""
        self.sock.close(linger=0)
        self.sock = self._socket()

    def send(self, op: str, args: dict[str, Any] | None = None) -> int:
        request_id = self.next_id
        self.next_id += 1
        self.sock.send(proto.encode_request(request_id, op, args or {}))
        return request_id

    def recv(self, timeout: float = 10.0) -> proto.Reply:
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply from {self.endpoint} within {timeout}s")
        return proto.decode_reply(self.sock.recv_multipart()[-1])

    def call(
        self, op: str, args: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> proto.Reply:
        """One request and its reply (replies to earlier, abandoned requests are skipped)."""
        request_id = self.send(op, args)
        deadline = time.monotonic() + timeout
        while True:
            reply = self.recv(max(0.001, deadline - time.monotonic()))
            if reply.id == request_id or reply.id is None:
                return reply

    def ok(
        self, op: str, args: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> dict[str, Any]:
        """The result of a request that must succeed."""
        reply = self.call(op, args, timeout)
        if not reply.ok or reply.result is None:
            raise AssertionError(f"{op} failed: {reply.code}: {reply.message}")
        return reply.result

    def close(self) -> None:
        self.sock.close(linger=0)


# -- task files -------------------------------------------------------------------


def temp_files(directory: Path, suffix: str = TEMP_SUFFIX) -> list[str]:
    """Temp files of interrupted or failed writes in a task directory (any file: ``suffix=""``)."""
    if not directory.is_dir():
        return []
    return sorted(name for name in os.listdir(directory) if name.endswith(suffix))


def all_temp_files(state_dir: Path) -> list[str]:
    """Temp files in every task directory under ``state_dir``."""
    tasks = state_dir / "tasks"
    if not tasks.is_dir():
        return []
    return [
        f"{task}/{name}" for task in sorted(os.listdir(tasks)) for name in temp_files(tasks / task)
    ]


def read_json(path: Path) -> Any:
    """A state file's content; raises ValueError when it does not parse."""
    return json.loads(path.read_bytes())


def unparsable_files(state_dir: Path) -> list[str]:
    """State files under ``state_dir`` that are not complete JSON documents."""
    bad: list[str] = []
    tasks = state_dir / "tasks"
    if not tasks.is_dir():
        return bad
    for task in sorted(os.listdir(tasks)):
        for name in (HISTORY, META):
            path = tasks / task / name
            if not path.exists():
                continue
            try:
                read_json(path)
            except ValueError:
                bad.append(f"{task}/{name}")
    return bad


def snapshot(directory: Path) -> dict[str, bytes]:
    """The bytes of the task's two state files (missing ones left out)."""
    found = {}
    for name in (HISTORY, META):
        path = directory / name
        if path.exists():
            found[name] = path.read_bytes()
    return found


# -- figures ----------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (nan when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """n, p50, p99 and max in milliseconds."""
    return {
        "n": len(seconds),
        "p50_ms": round(percentile(seconds, 0.50) * 1000, 3),
        "p99_ms": round(percentile(seconds, 0.99) * 1000, 3),
        "max_ms": round(max(seconds) * 1000, 3) if seconds else math.nan,
    }


def proc_status_kb(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def open_fds(pid: int) -> int:
    """How many descriptors the process has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def machine() -> dict[str, Any]:
    """What ran the figures."""
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "kernel": os.uname().release,
        "zmq": zmq.zmq_version(),
    }


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """A script's argument parser: the first line of its docstring, and ``--json``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


def finish(name: str, summary: dict[str, Any], as_json: bool) -> int:
    """Print a script's summary (see :func:`emit`); its exit code, 0 when it ``passed``."""
    emit(name, summary, as_json)
    return 0 if summary["passed"] else 1


def role_argv(module: str, role: str, endpoint: str, **flags: object) -> list[str]:
    """The command that runs the script ``module`` again in a child, as its hidden ``--role``
    on ``endpoint``, each of ``flags`` given as ``--name value`` (``think_ms``: ``--think-ms``)."""
    argv = [sys.executable, "-m", module, "--role", role, "--endpoint", endpoint]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def emit(name: str, summary: dict[str, Any], as_json: bool) -> None:
    """Print a script's summary as readable lines or as one JSON document."""
    if as_json:
        print(json.dumps({"script": name, **summary}, indent=2, default=str))
        return
    print(f"== {name}")
    for key, value in summary.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for inner, item in value.items():
                print(f"  {inner}: {item}")
        else:
            print(f"{key}: {value}")


# -- scratch space and privileges --------------------------------------------------


@contextlib.contextmanager
def scratch(prefix: str, owner: int | None = None) -> Iterator[Path]:
    """A fresh directory under the temp dir, removed afterwards.

    With ``owner`` it is 0755 and its ``run``/``state`` subdirectories belong
    to that uid, so a daemon running as that uid can use them.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if owner is not None:
            root.chmod(0o755)
            for sub in ("run", "state"):
                (root / sub).mkdir()
                os.chown(root / sub, owner, owner)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_uid(uid: int, stage: Path) -> list[str]:
    """A prefix that runs a command as ``uid`` with no supplementary groups (``setpriv``).

    The command is this checkout's Python, so the other uid must be able to
    reach the checkout. When a directory above it is closed to others (a 0700
    ``mktemp -d`` folder or home), the command runs in a mount namespace of
    its own where that directory is an open tmpfs holding only the path down
    to the checkout (:func:`open_path_prefix`); nothing changes outside it.

    Args:
        uid: the uid to run as.
        stage: an empty directory ``as_uid`` may use as a mount point (the
            caller's scratch dir, say); created when missing.
    """
    return [*open_path_prefix(REPO, stage), *_setpriv(uid)]


def _setpriv(uid: int) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def closed_dirs(path: Path) -> list[Path]:
    """``path`` and the directories above it that other users cannot enter, deepest first."""
    return [
        directory
        for directory in (path, *path.parents)
        if not directory.stat().st_mode & stat.S_IXOTH
    ]


_OPEN_PATH = r"""
set -e
stage=$1; shift
n=0
while [ "$1" != "--" ]; do
    closed=$1; child=$2; shift 2
    n=$((n + 1))
    mkdir -p "$stage/$n"
    mount --rbind "$closed/$child" "$stage/$n"
    mount -t tmpfs -o mode=0755,size=1m ctxwin-open-path "$closed"
    mkdir "$closed/$child"
    mount --rbind "$stage/$n" "$closed/$child"
done
shift
exec "$@"
"""


def open_path_prefix(path: Path, stage: Path) -> list[str]:
    """A prefix that makes ``path`` reachable by every uid for one command, or ``[]``.

    Each directory above ``path`` that others cannot enter is covered, in a
    private mount namespace (``unshare --mount``, which execs in place, so the
    process id stays the command's), by a 0755 tmpfs holding one bind mount:
    the directory on the way to ``path``. ``path`` itself must be open.
    """
    closed = closed_dirs(path)
    if path in closed:
        raise ValueError(f"{path} itself is closed to other users")
    if not closed:
        return []
    stage.mkdir(parents=True, exist_ok=True)
    pairs: list[str] = []
    for directory in closed:  # deepest first: its bind mount goes inside the next cover
        child = path.relative_to(directory).parts[0]
        pairs += [str(directory), child]
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        _OPEN_PATH,
        "open-path",
        str(stage),
        *pairs,
        "--",
    ]


DAC_CAPS = ("cap_dac_override", "cap_dac_read_search", "cap_fowner")


def without_caps(caps: Sequence[str] = DAC_CAPS) -> list[str]:
    """A ``capsh`` prefix that runs a command as root without ``caps`` (it execs in place)."""
    return ["capsh", "--drop=" + ",".join(caps), "--", "-c", 'exec "$0" "$@"']


def limit_preexec(limit: int, value: int, hard: int | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` setting soft and hard ``limit`` (a ``resource.RLIMIT_*``) to ``value``."""

    def apply() -> None:
        resource.setrlimit(limit, (value, value if hard is None else hard))

    return apply


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a system command, capturing its output."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=check)


def require(*argv: str) -> None:
    """Run a privileged system command; PermissionError with the reason when the kernel or
    the tool refuses it (or it is not installed)."""
    if shutil.which(argv[0]) is None:
        raise PermissionError(f"{argv[0]} is not installed")
    result = run(*argv, check=False)
    if result.returncode != 0:
        raise PermissionError(
            f"`{' '.join(argv)}` failed: {result.stderr.strip() or result.returncode}"
        )


@contextlib.contextmanager
def read_only_bind(directory: Path) -> Iterator[None]:
    """Make ``directory`` a read-only bind mount of itself for the duration (EROFS)."""
    require("mount", "--bind", str(directory), str(directory))
    try:
        require("mount", "-o", "remount,bind,ro", str(directory))
        yield
    finally:
        run("umount", "-l", str(directory), check=False)


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``chattr +i`` on ``path`` for the duration (EPERM even for root)."""
    require("chattr", "+i", str(path))
    try:
        yield
    finally:
        run("chattr", "-i", str(path), check=False)


@contextlib.contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[None]:
    """A tmpfs of ``size`` mounted on ``directory`` for the duration."""
    directory.mkdir(parents=True, exist_ok=True)
    require("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory))
    try:
        yield
    finally:
        run("umount", "-l", str(directory), check=False)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` with one file; returns its path."""
    filler = directory / "filler.bin"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as handle:
        with contextlib.suppress(OSError):
            for _ in range(1 << 20):  # bounded: 64 GiB
                handle.write(chunk)
        with contextlib.suppress(OSError):
            for _ in range(65536):
                handle.write(b"\0")
    return filler


@dataclass
class Strace:
    """``strace`` attached to a running process, injecting faults into some syscalls.

    Args:
        pid: the process to attach to (all its threads, and new ones).
        inject: the ``-e inject=`` expression, e.g. ``fsync:error=EIO``.
        log: where strace writes its messages.
    """

    pid: int
    inject: str
    log: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def traced(self) -> bool:
        """Whether every thread of the process is traced by this strace."""
        assert self.proc is not None
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except FileNotFoundError:
            return False
        for tid in tids:
            try:
                status = Path(f"/proc/{self.pid}/task/{tid}/status").read_text()
            except FileNotFoundError:
                continue
            tracer = next(
                (line.split()[1] for line in status.splitlines() if line.startswith("TracerPid:")),
                "0",
            )
            if int(tracer) != self.proc.pid:
                return False
        return True

    def __enter__(self) -> Strace:
        if shutil.which("strace") is None:
            raise PermissionError("strace is not installed")
        syscalls = self.inject.partition(":")[0]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    "strace",
                    "-f",
                    "-p",
                    str(self.pid),
                    "-e",
                    f"trace={syscalls}",
                    "-e",
                    f"inject={self.inject}",
                    "-o",
                    "/dev/null",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while not self.traced():
            if self.proc.poll() is not None:
                raise PermissionError(f"strace could not attach: {self.log.read_text()[-500:]}")
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise TimeoutError("strace did not attach to every thread")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        """Detach: the process runs on, unfaulted."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
