"""Who may talk to a daemon over TCP: CURVE keys, the allow-list, task-id prefixes per key.

One daemon for the module binds an ipc endpoint and ``tcp://0.0.0.0:PORT``
with keys made by ``ctxwin keys``; clients reach it over real TCP on loopback.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq

from ctxwin import proto
from ctxwin.client import (
    AsyncClient,
    AuthenticationError,
    Client,
    CtxwinError,
    ForbiddenError,
    OwnedElsewhereError,
    RequestTimeoutError,
)
from ctxwin.client.cli import main as cli
from ctxwin.daemon._auth import KeysError, load_server_keys
from ctxwin.proto import Usage
from tests._client_data import MODEL, conversation
from tests._daemon import DaemonProcess, call, free_port
from tests._redis import RedisServer

MESSAGES = conversation(3)
USAGE: Usage = {"ts": 1, "tokens_in": 100, "tokens_out": 10}


def keys(*argv: str) -> str:
    """Run ``ctxwin keys ...``; its output (fails on a non-zero exit)."""
    out, err = io.StringIO(), io.StringIO()
    code = cli(["keys", *argv], out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


@dataclass
class Setup:
    """The module's daemon and the key directories around it."""

    daemon: DaemonProcess
    tcp: str
    server: Path  # the daemon's keys directory
    clients: Path  # one keys directory per client name below it

    def secret(self, name: str) -> Path:
        return self.clients / name / "client.key_secret"

    def client(self, name: str, **options: Any) -> Client:
        options.setdefault("timeout", 5)
        return Client(
            self.tcp,
            server_key=str(self.server / "server.key"),
            client_key=self.secret(name),
            **options,
        )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("auth")
    server, clients = root / "server-keys", root / "client-keys"
    keys("server", "--dir", str(server))
    for name in ("alice", "bob", "eve"):
        keys("client", name, "--dir", str(clients / name))
    for name in ("alice", "bob", "dave"):  # eve has a key pair, but it is not allowed
        if name == "dave":
            keys("client", name, "--dir", str(clients / name))
        keys("allow", str(clients / name / "client.key"), "--name", name, "--dir", str(server))
    config = root / "ctxwind.toml"
    # dave is allowed but named nowhere here: once a key is bound, he gets nothing.
    # ci_runner is a typo for no key at all: logged at start.
    config.write_text(
        '[client_tasks]\nalice = "*"\nbob = ["bob-", "shared-"]\nci_runner = ["ci-"]\n'
    )
    os.chmod(config, 0o600)
    port = free_port()
    daemon = DaemonProcess(
        root,
        "--endpoint",
        f"tcp://0.0.0.0:{port}",
        "--allow-remote",
        "--keys-dir",
        str(server),
        "--config",
        str(config),
    )
    with daemon:
        yield Setup(daemon, f"tcp://127.0.0.1:{port}", server, clients)


def test_the_keys_are_private_files(setup: Setup) -> None:
    """Every key file is 0600, every keys directory 0700."""
    for directory in (setup.server, setup.server / "allowed", setup.clients / "alice"):
        assert directory.stat().st_mode & 0o777 == 0o700, directory
        for path in directory.iterdir():
            if path.is_file():
                assert path.stat().st_mode & 0o777 == 0o600, path
    assert (setup.server / "allowed" / "alice.key").exists()


def test_a_client_without_keys_gets_no_answer_over_tcp(setup: Setup) -> None:
    """A NULL socket's request is never answered; the client library says why within a second."""
    with pytest.raises(TimeoutError):
        call(setup.tcp, "inspect", {"task": "alice-secret"}, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(AuthenticationError, match="requires CURVE") as caught:
        Client(setup.tcp, timeout=10).inspect("alice-secret")
    assert time.monotonic() - started < 3.0  # its timeout is 10 s
    assert caught.value.endpoint == setup.tcp

    async def asynchronous() -> None:
        async with AsyncClient(setup.tcp, timeout=10) as client:
            await client.stats()

    with pytest.raises(AuthenticationError, match="requires CURVE"):
        asyncio.run(asynchronous())
    assert setup.daemon.call("ping").ok  # the daemon serves the others meanwhile


def test_a_client_pinning_the_wrong_server_key_is_refused(setup: Setup) -> None:
    """The handshake fails at once: the request is never sent."""
    wrong = str(setup.clients / "eve" / "client.key")  # some other public key
    started = time.monotonic()
    with (
        Client(setup.tcp, timeout=10, server_key=wrong, client_key=setup.secret("alice")) as c,
        pytest.raises(AuthenticationError, match="does not hold the pinned server key"),
    ):
        c.ping()
    assert time.monotonic() - started < 3.0  # its timeout is 10 s


def test_a_key_not_on_the_allow_list_is_refused(setup: Setup) -> None:
    """eve pins the right server key but her own key is not allowed: refused, blocking and async."""
    with setup.client("eve") as client, pytest.raises(AuthenticationError, match="allow-list"):
        client.inspect("alice-1")

    async def asynchronous() -> None:
        async with AsyncClient(
            setup.tcp,
            timeout=10,
            server_key=str(setup.server / "server.key"),
            client_key=setup.secret("eve"),
        ) as client:
            await client.inspect("alice-1")

    with pytest.raises(AuthenticationError, match="allow-list"):
        asyncio.run(asynchronous())
    assert "key not allowed" in setup.daemon.log()


def every_op(client: Client, task: str) -> dict[str, Any]:
    """Each wire op once on ``task`` (or none); the result of each, by op."""
    calls: dict[str, Callable[[], Any]] = {
        "ping": lambda: client.ping(),
        "stats": lambda: client.stats(),
        "context_window_info": lambda: client.context_window_info(MODEL),
        "should_compact": lambda: client.should_compact(USAGE, MODEL, task=task),
        "next_truncation_range": lambda: client.next_truncation_range(MESSAGES, None, "half"),
        "prepare_request": lambda: client.prepare_request(task, MESSAGES, MODEL),
        "plan": lambda: client.plan(task, MESSAGES, MODEL),
        "truncated_messages": lambda: client.truncated_messages(task, MESSAGES),
        "optimize_file_reads": lambda: client.optimize_file_reads(task, MESSAGES),
        "optimize_file_reads_in_memory": lambda: client.optimize_file_reads_in_memory(
            task, MESSAGES
        ),
        "compact_subagent": lambda: client.compact_subagent(task, MESSAGES),
        "apply_truncation_notice": lambda: client.apply_truncation_notice(task, MESSAGES),
        "compact": lambda: client.compact(task, MESSAGES, "quarter"),
        "condensed": lambda: client.condensed(task, MESSAGES),
        "rollback": lambda: client.rollback(task, 0),
        "inspect": lambda: client.inspect(task),
        "flush": lambda: client.flush(task),
        "close": lambda: client.close_task(task),
        "count_tokens": lambda: client.count_tokens(MESSAGES),
    }
    results: dict[str, Any] = {}
    for op, spec in sorted(proto.OPS.items()):
        if op in calls:
            results[op] = calls[op]()
            continue
        # An op newer than this table: its reply must come from the daemon's own checks.
        try:
            results[op] = client.call(_raw(op, {"task": task} if spec.needs_task else {}))
        except (AuthenticationError, ForbiddenError):
            raise
        except CtxwinError as exc:
            results[op] = exc
    return results


def _raw(op: str, args: dict[str, Any]) -> Any:
    from ctxwin.client._core import Call

    return Call(op, args)


def test_an_allowed_key_works_for_every_op(setup: Setup) -> None:
    """alice (allowed, bound to nothing) runs every op over TCP, on any task."""
    with setup.client("alice") as client:
        results = every_op(client, "alice-all-ops")
        assert set(results) == set(proto.OPS)
        assert results["ping"]["pong"] is True
        assert results["compact"]["changed"]
        assert results["inspect"]["deleted_range"] is not None
        assert results["close"]["closed"] is True
        assert client.truncated_messages("bob-1", MESSAGES)["messages"] == MESSAGES
    assert "client_allowed" in setup.daemon.log()


def test_a_key_bound_to_prefixes_cannot_touch_other_tasks(setup: Setup) -> None:
    """bob may use bob-* and shared-* only: every task op on another task is forbidden."""
    with setup.client("alice") as alice:
        alice.truncated_messages("alice-private", MESSAGES, deleted_range=[2, 3])
    with setup.client("bob") as bob:
        assert set(every_op(bob, "bob-own")) == set(proto.OPS)  # his own tasks: all of it
        bob.truncated_messages("shared-1", MESSAGES)
        for op, spec in proto.OPS.items():
            if not spec.needs_task:
                continue
            args: dict[str, Any] = {"task": "alice-private"}
            with pytest.raises(ForbiddenError, match="bob-"):
                bob.call(_raw(op, args))
        with pytest.raises(ForbiddenError, match="alice-private"):
            bob.inspect("alice-private")
        with pytest.raises(ForbiddenError, match="every task"):
            bob.flush()  # every task at once
        with pytest.raises(ForbiddenError):
            bob.should_compact(USAGE, MODEL, task="alice-private")
        assert bob.should_compact(USAGE, MODEL)["compact"] is False  # no task: allowed
    with setup.client("alice") as alice:
        assert alice.inspect("alice-private")["deleted_range"] == [2, 3]  # untouched
    # The owner's ipc socket is not bound to any prefix.
    assert setup.daemon.call("inspect", {"task": "alice-private"}).ok


def test_cli_with_keys(setup: Setup) -> None:
    """``ctxwin --server-key ... --client-key ...`` works; without them it says why (exit 3)."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["--endpoint", setup.tcp, "--server-key", str(setup.server / "server.key")]
    code = cli([*argv, "--client-key", str(setup.secret("alice")), "--json", "ping"], out=out)
    assert code == 0
    assert json.loads(out.getvalue())["pong"] is True
    code = cli(["--endpoint", setup.tcp, "--timeout", "10", "ping"], out=out, err=err)
    assert code == 3
    assert "requires CURVE" in err.getvalue()
    err = io.StringIO()
    code = cli([*argv, "--client-key", str(setup.secret("eve")), "ping"], out=out, err=err)
    assert code == 3
    assert "allow-list" in err.getvalue()


def test_a_key_allowed_while_running_needs_no_restart(setup: Setup) -> None:
    """``ctxwin keys allow`` takes effect at the client's next connection; removing it refuses."""
    keys("client", "carol", "--dir", str(setup.clients / "carol"))
    with setup.client("carol") as client, pytest.raises(AuthenticationError):
        client.ping()
    public = setup.clients / "carol" / "client.key"
    keys("allow", str(public), "--name", "carol", "--dir", str(setup.server))
    # Allowed now: past the handshake, and refused by the daemon (carol has no binding).
    with setup.client("carol") as client, pytest.raises(ForbiddenError, match="bound to no"):
        client.ping()
    (setup.server / "allowed" / "carol.key").unlink()
    with setup.client("carol") as client, pytest.raises(AuthenticationError):
        client.ping()


def test_a_public_bind_is_logged(setup: Setup) -> None:
    events = [json.loads(line) for line in setup.daemon.log().splitlines() if line.startswith("{")]
    public = [event for event in events if event.get("event") == "listening_publicly"]
    assert len(public) == 1
    assert public[0]["mechanism"] == "curve"
    assert public[0]["endpoint"].startswith("tcp://0.0.0.0:")


def _start(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxwin.daemon", "--log-format", "json", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_non_loopback_bind_without_keys_is_refused(tmp_path: Path) -> None:
    """--allow-remote alone does not bind 0.0.0.0: the daemon exits and says why."""
    state = ["--state-dir", str(tmp_path / "state")]
    done = _start(["--endpoint", f"tcp://0.0.0.0:{free_port()}", "--allow-remote", *state])
    assert done.returncode == 2
    assert "no keys are configured" in done.stderr
    assert "ctxwin keys server" in done.stderr
    done = _start(["--endpoint", f"tcp://[::]:{free_port()}", "--allow-remote", *state])
    assert done.returncode == 2
    assert "no keys are configured" in done.stderr


def test_unusable_keys_stop_the_start(tmp_path: Path) -> None:
    """A missing server key, or a secret others can read, is refused with the fix named."""
    keys_dir = tmp_path / "keys"
    argv = ["--endpoint", f"tcp://127.0.0.1:{free_port()}", "--keys-dir", str(keys_dir)]
    argv += ["--state-dir", str(tmp_path / "state")]
    keys_dir.mkdir(mode=0o700)
    done = _start(argv)
    assert done.returncode == 1
    assert "ctxwin keys server" in done.stderr
    keys("server", "--dir", str(keys_dir))
    os.chmod(keys_dir / "server.key_secret", 0o644)
    with pytest.raises(KeysError, match="chmod 600"):
        load_server_keys(keys_dir)
    os.chmod(keys_dir / "server.key_secret", 0o600)
    os.chmod(keys_dir / "allowed", 0o777)
    with pytest.raises(KeysError, match="writable by others"):
        load_server_keys(keys_dir)
    os.chmod(keys_dir / "allowed", 0o700)
    assert load_server_keys(keys_dir).public == proto.read_key_file(keys_dir / "server.key").public


def test_keys_command_refuses_to_overwrite_and_needs_a_name(tmp_path: Path) -> None:
    err = io.StringIO()
    keys("server", "--dir", str(tmp_path))
    assert cli(["keys", "server", "--dir", str(tmp_path)], err=err) == 2
    assert "--force" in err.getvalue()
    public = proto.read_key_file(tmp_path / "server.key").public
    err = io.StringIO()
    assert cli(["keys", "allow", public.decode(), "--dir", str(tmp_path)], err=err) == 2
    assert "--name" in err.getvalue()
    keys("allow", public.decode(), "--name", "raw", "--dir", str(tmp_path))
    assert proto.read_key_file(tmp_path / "allowed" / "raw.key").public == public


def test_keys_allow_takes_a_key_that_begins_with_a_dash(tmp_path: Path) -> None:
    """Z85 has '-' among its characters: such a key is a key, not an unknown option."""
    public = next(key for key, _ in iter(zmq.curve_keypair, None) if key.startswith(b"-"))
    keys("allow", public.decode(), "--name", "dash", "--dir", str(tmp_path))
    assert proto.read_key_file(tmp_path / "allowed" / "dash.key").public == public
    keys("allow", "--dir", str(tmp_path / "other"), public.decode(), "--name", "again")
    assert proto.read_key_file(tmp_path / "other" / "allowed" / "again.key").public == public


def test_a_client_without_its_key_pair_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pinned server key without a client key pair is refused before anything is sent."""
    server = tmp_path / "s"
    keys("server", "--dir", str(server))
    monkeypatch.setenv(proto.KEYS_DIR_ENV, str(tmp_path / "none"))
    monkeypatch.delenv(proto.CLIENT_KEY_ENV, raising=False)
    with pytest.raises(CtxwinError, match="ctxwin keys client") as caught:
        Client("tcp://127.0.0.1:1", server_key=str(server / "server.key"))
    assert caught.value.local
    monkeypatch.setenv(proto.SERVER_KEY_ENV, "not a key")
    with pytest.raises(CtxwinError, match="cannot read key file"):
        Client("tcp://127.0.0.1:1")


def test_a_rogue_server_never_receives_the_request(tmp_path: Path) -> None:
    """A pinning client that reaches a server without the key's secret sends nothing to it."""
    server = tmp_path / "s"
    keys("server", "--dir", str(server))
    keys("client", "me", "--dir", str(tmp_path / "c"))
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    for curve in (False, True):
        rogue = context.socket(zmq.ROUTER)
        rogue.setsockopt(zmq.LINGER, 0)
        if curve:  # a CURVE server with a key pair of its own
            _public, secret = zmq.curve_keypair()
            rogue.setsockopt(zmq.CURVE_SERVER, 1)
            rogue.setsockopt(zmq.CURVE_SECRETKEY, secret)
        port = rogue.bind_to_random_port("tcp://127.0.0.1")
        try:
            client = Client(
                f"tcp://127.0.0.1:{port}",
                timeout=5,
                server_key=str(server / "server.key"),
                client_key=tmp_path / "c" / "client.key_secret",
            )
            with client, pytest.raises(AuthenticationError):
                client.truncated_messages("t", MESSAGES)
            assert not rogue.poll(200), "the rogue received a request"
        finally:
            rogue.close(linger=0)


def test_a_timeout_is_not_taken_for_a_refusal(setup: Setup) -> None:
    """An allowed client whose daemon is slow still times out as a timeout (not unauthenticated)."""
    with setup.client("alice", timeout=0.0) as client, pytest.raises(RequestTimeoutError):
        client.ping()


# Fleet referrals: the owner named by owned_elsewhere comes from the Redis lease.


def plant_lease(redis: RedisServer, task: str, owner: str) -> None:
    """Write a lease naming ``owner`` for ``task``, as anyone who can write Redis could."""
    import redis as redis_sync

    client = redis_sync.Redis(unix_socket_path=str(redis.socket))
    try:
        client.set(f"ctxwin:{{{task}}}:lease", f"{owner} rogue\n7".encode(), px=60_000)
    finally:
        client.close()


class Rogue:
    """A ROUTER on loopback TCP that answers nothing and records whether anything arrived."""

    def __init__(self, curve: bool = False) -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if curve:  # a CURVE server with a key pair of its own
            _, secret = zmq.curve_keypair()
            self.socket.setsockopt(zmq.CURVE_SERVER, 1)
            self.socket.setsockopt(zmq.CURVE_SECRETKEY, secret)
        self.endpoint = f"tcp://127.0.0.1:{self.socket.bind_to_random_port('tcp://127.0.0.1')}"

    def received(self) -> bool:
        return bool(self.socket.poll(200))

    def close(self) -> None:
        self.socket.close(linger=0)


def test_a_referral_without_keys_is_followed_only_to_trusted_endpoints(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """No server key pinned: an owner on TCP (or someone else's ipc socket) is not followed."""
    rogue = Rogue()
    try:
        with DaemonProcess(tmp_path, "--state-store", redis_server.url) as daemon:
            plant_lease(redis_server, "victim", rogue.endpoint)
            with Client(daemon.endpoint, timeout=5) as client:
                with pytest.raises(OwnedElsewhereError, match="not followed") as caught:
                    client.truncated_messages("victim", MESSAGES)
                assert caught.value.owner == rogue.endpoint
                assert client.endpoint == daemon.endpoint

            async def asynchronous() -> None:
                async with AsyncClient(daemon.endpoint, timeout=5) as client:
                    await client.inspect("victim")

            with pytest.raises(OwnedElsewhereError, match="not followed"):
                asyncio.run(asynchronous())
            assert not rogue.received()
            if os.getuid() == 0:  # a socket of another user's, in a directory of its own
                other = tmp_path / "other"
                other.mkdir()
                sock = context_socket_file(other / "s.sock")
                os.chown(other / "s.sock", 65534, 65534)
                os.chown(other, 65534, 65534)
                plant_lease(redis_server, "victim2", f"ipc://{other / 's.sock'}")
                with (
                    Client(daemon.endpoint, timeout=5) as client,
                    pytest.raises(OwnedElsewhereError, match="not this user's"),
                ):
                    client.inspect("victim2")
                sock.close()
            # Listed by the caller: followed (the rogue gets it, as asked).
            with Client(daemon.endpoint, timeout=1, trusted_endpoints=[rogue.endpoint]) as client:
                with pytest.raises(RequestTimeoutError):
                    client.inspect("victim")
                assert client.endpoint == rogue.endpoint
            assert rogue.received()
    finally:
        rogue.close()


def context_socket_file(path: Path) -> socket.socket:
    """A listening unix socket at ``path``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_a_referral_with_keys_reaches_only_a_daemon_holding_the_key(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A fleet sharing one key pair: followed to the real owner; a planted owner gets nothing."""
    keys_dir = tmp_path / "keys"
    keys("server", "--dir", str(keys_dir))
    keys("client", "agent", "--dir", str(tmp_path / "agent"))
    keys("allow", str(tmp_path / "agent" / "client.key"), "--name", "agent", "--dir", str(keys_dir))

    def fleet(name: str) -> tuple[DaemonProcess, str]:
        tcp = f"tcp://127.0.0.1:{free_port()}"
        (tmp_path / name).mkdir()
        daemon = DaemonProcess(
            tmp_path / name,
            "--state-store",
            redis_server.url,
            "--endpoint",
            tcp,
            "--advertise",
            tcp,
            "--keys-dir",
            str(keys_dir),
        )
        return daemon, tcp

    (first, first_tcp), (second, second_tcp) = fleet("a"), fleet("b")

    def client() -> Client:
        return Client(
            second_tcp,
            timeout=5,
            server_key=str(keys_dir / "server.key"),
            client_key=tmp_path / "agent" / "client.key_secret",
        )

    with first, second:
        assert first.call("truncated_messages", {"task": "t", "messages": MESSAGES}).ok
        with client() as agent:
            assert agent.inspect("t")["owner"] == first_tcp
            assert agent.endpoint == first_tcp  # followed, with the same pinned key
        for curve in (False, True):
            rogue = Rogue(curve)
            try:
                task = f"planted-{int(curve)}"
                plant_lease(redis_server, task, rogue.endpoint)
                with client() as agent, pytest.raises(AuthenticationError):
                    agent.truncated_messages(task, MESSAGES)
                assert not rogue.received()
            finally:
                rogue.close()


def test_a_refused_client_that_keeps_trying_does_not_flood_the_log(setup: Setup) -> None:
    """Five connections in a row, each with a new key not allowed: one log line at most.

    Refusals are throttled by address, whatever the key (a new key needs only the
    server's public key to make).
    """
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    server_key = proto.read_key_file(setup.server / "server.key").public
    tried: list[bytes] = []
    for _ in range(5):
        public, secret = zmq.curve_keypair()
        tried.append(public)
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        try:
            sock.connect(setup.tcp)
            assert monitor.poll(5000), "the handshake was not refused"
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
    log = setup.daemon.log().splitlines()
    lines = [line for line in log if any(key.decode() in line for key in tried)]
    assert len(lines) <= 1, lines  # none when an earlier test's refusal is within 10 s
    assert all(json.loads(line)["event"] == "client_refused" for line in lines)


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:7878", True),
        ("tcp://127.0.0.2:7878", True),
        ("tcp://[::1]:7878", True),
        ("tcp://localhost:7878", True),
        ("tcp://0.0.0.0:7878", False),
        ("tcp://*:7878", False),
        ("tcp://[::]:7878", False),
        ("tcp://10.0.0.1:7878", False),
        ("tcp://eth0:7878", False),
        ("tcp://127.0.0.1;10.0.0.1:7878", False),
        ("ipc:///tmp/x.sock", False),
    ],
)
def test_which_endpoints_are_loopback(endpoint: str, loopback: bool) -> None:
    assert proto.is_loopback(endpoint) is loopback


def test_keys_allow_names_the_key_as_the_operator_says(tmp_path: Path) -> None:
    """The file's name (or --name) names the allowed key, never the name written inside it."""
    keys("server", "--dir", str(tmp_path / "server"))
    keys("client", "admin", "--dir", str(tmp_path / "runner"))  # the client calls itself admin
    copied = tmp_path / "ci-runner2.key"
    copied.write_bytes((tmp_path / "runner" / "client.key").read_bytes())
    said = keys("allow", str(copied), "--dir", str(tmp_path / "server"))
    assert "allowed 'ci-runner2' (named by the file name ci-runner2.key)" in said
    assert "calls itself 'admin': not used" in said
    assert sorted(p.name for p in (tmp_path / "server" / "allowed").iterdir()) == ["ci-runner2.key"]
    err = io.StringIO()  # client.key is every client's file name: it names no one
    argv = ["keys", "allow", str(tmp_path / "runner" / "client.key")]
    assert cli([*argv, "--dir", str(tmp_path / "server")], err=err) == 2
    assert "--name" in err.getvalue()
    for bad in ("default", "../x", "a:b"):
        err = io.StringIO()
        assert cli([*argv, "--name", bad, "--dir", str(tmp_path / "server")], err=err) == 2
        assert "not a client name" in err.getvalue()


def test_an_allowed_key_without_a_binding_gets_nothing(setup: Setup) -> None:
    """Once [client_tasks] binds a key, a key it does not name is refused every op; the start
    logs each allowed key's prefixes and the binding that names no key."""
    with setup.client("dave") as dave:
        for call in (dave.ping, dave.stats, lambda: dave.inspect("dave-1")):
            with pytest.raises(ForbiddenError, match="'dave' is bound to no task"):
                call()
    events = [json.loads(line) for line in setup.daemon.log().splitlines() if line[:1] == "{"]
    bound = {e["client"]: e["tasks"] for e in events if e.get("event") == "client_binding"}
    assert bound["alice"] == "*"
    assert bound["bob"] == ["bob-", "shared-"]
    assert bound["dave"].startswith("none")
    typo = [e for e in events if e.get("event") == "binding_without_key"]
    assert {e["client"] for e in typo} == {"ci_runner"}  # at start, and at each change
    assert not any("secret" in line.lower() for line in setup.daemon.log().splitlines())


def test_a_default_binding_covers_the_keys_the_table_does_not_name(tmp_path: Path) -> None:
    """``default = "*"`` lets unbound keys use every task; prefixes bind them; none refuses."""
    from ctxwin.daemon._config_sources import load_config
    from ctxwin.daemon._server import _check_binding

    def allowed(bindings: dict[str, tuple[str, ...]], client: str, task: str) -> bool:
        try:
            _check_binding(bindings, client, "inspect", task)
        except proto.ProtocolError as exc:
            if exc.code is not proto.ErrorCode.FORBIDDEN:
                raise
            return False
        return True

    bob: dict[str, tuple[str, ...]] = {"bob": ("bob-",)}
    assert not allowed(bob, "key:dave", "any")
    assert allowed({**bob, "default": ("",)}, "key:dave", "any")
    assert allowed({**bob, "default": ("guest-",)}, "key:dave", "guest-1")
    assert not allowed({**bob, "default": ("guest-",)}, "key:dave", "bob-1")
    assert allowed({}, "key:dave", "any")  # no binding at all: every key, every task
    assert allowed(bob, "uid:1000", "any")  # ipc is the daemon's own user: never bound
    config = tmp_path / "ctxwind.toml"
    config.write_text('[client_tasks]\nbob = "bob-"\ndefault = "*"\n')
    tasks = load_config(["--config", str(config)], {}).client_tasks
    assert tasks == {"bob": ("bob-",), "default": ("",)}


def curve_peer(setup: Setup, name: str, routing_id: bytes | None = None) -> zmq.Socket[bytes]:
    """A raw DEALER with ``name``'s keys, connected to the module's daemon."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    pair = proto.read_key_file(setup.secret(name), secret=True)
    assert pair.secret is not None
    sock.setsockopt(zmq.CURVE_SERVERKEY, proto.read_key_file(setup.server / "server.key").public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, pair.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, pair.secret)
    if routing_id is not None:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.connect(setup.tcp)
    return sock


def test_a_second_connection_with_the_same_routing_id_takes_no_reply(setup: Setup) -> None:
    """Two real clients choosing one routing id: bob (bound away from alice's task) never
    receives alice's inspect of it; ids a peer chooses are not answered at all."""
    with setup.client("alice") as alice:
        alice.truncated_messages("alice-handover", MESSAGES, deleted_range=[2, 3])
    first = curve_peer(setup, "alice", b"same-id")
    second: zmq.Socket[bytes] | None = None
    try:
        for request_id in range(1, 401):  # replies still on their way when bob connects
            first.send(proto.encode_request(request_id, "inspect", {"task": "alice-handover"}))
        second = curve_peer(setup, "bob", b"same-id")
        second.send(proto.encode_request(1, "ping", {}))
        deadline = time.monotonic() + 3
        stolen: list[bytes] = []
        while time.monotonic() < deadline:
            if second.poll(100):
                stolen.append(second.recv())
        assert stolen == []
        assert not first.poll(0)  # a chosen id is refused, not answered
    finally:
        first.close(linger=0)
        if second is not None:
            second.close(linger=0)
    assert '"code": "routing_id"' in setup.daemon.log()
    with setup.client("alice") as alice:  # the daemon's own ids are answered as ever
        assert alice.inspect("alice-handover")["deleted_range"] == [2, 3]


def test_routing_ids_the_daemon_will_give_cannot_be_taken_first(tmp_path: Path) -> None:
    """Peers taking the ids libzmq's ROUTER generates from an unseeded ``rand()`` (00 6b8b4567
    on) would abort the daemon when it gives one of them to a new client."""
    endpoint = f"ipc://{tmp_path}/d.sock"
    with DaemonProcess(tmp_path, "--endpoint", endpoint) as daemon:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        squatters = []
        for offset in range(64):
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, b"\0" + (0x6B8B4567 + offset).to_bytes(4, "big"))
            sock.connect(endpoint)
            sock.send(proto.encode_request(1, "ping", {}))
            squatters.append(sock)
        try:
            for _ in range(16):  # each new client gets the next generated id
                assert call(endpoint, "ping", {}, timeout=5.0).ok
            assert daemon.proc is not None
            assert daemon.proc.poll() is None  # alive: no libzmq assertion
        finally:
            for sock in squatters:
                sock.close(linger=0)


def test_a_silent_tcp_connection_is_dropped(setup: Setup) -> None:
    """A connection that never finishes its handshake is closed after 5 s (libzmq's default: 30)."""
    host, port = setup.tcp.removeprefix("tcp://").rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port))) as raw:
        raw.settimeout(15)
        data = b""
        while chunk := raw.recv(4096):  # the greeting, then the close
            data += chunk
    assert time.monotonic() - started < 10, "the silent connection was kept"


def test_a_pinned_server_key_another_user_can_write_is_refused(setup: Setup) -> None:
    """A server.key writable by others (whoever can write it picks the trusted server)."""
    pinned = setup.clients / "alice" / "pinned.key"
    pinned.write_bytes((setup.server / "server.key").read_bytes())
    os.chmod(pinned, 0o666)
    with pytest.raises(CtxwinError, match="writable by others"):
        Client(setup.tcp, server_key=str(pinned), client_key=setup.secret("alice")).ping()
    os.chmod(pinned, 0o644)
    with Client(
        setup.tcp, timeout=5, server_key=str(pinned), client_key=setup.secret("alice")
    ) as alice:
        assert alice.ping()["pong"] is True
    if os.getuid() == 0:
        os.chown(pinned, 65534, 65534)
        with pytest.raises(CtxwinError, match="belongs to uid 65534"):
            Client(setup.tcp, server_key=str(pinned), client_key=setup.secret("alice")).ping()


def test_an_ipc_directory_others_can_write_stops_the_start(tmp_path: Path) -> None:
    """The daemon's own directory, world-writable: another user could swap the socket."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    result = _start(["--endpoint", f"ipc://{open_dir}/d.sock", "--state-dir", str(tmp_path / "s")])
    assert result.returncode == 1, result.stderr
    assert "writable by others" in result.stderr
    assert not (open_dir / "d.sock").exists()


def test_the_allow_list_is_read_again_only_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handshakes reuse the allow-list until its directory or a key file changes: a key added
    is seen at the next handshake (the directory changed), a key file made writable by others
    once its files are looked at again (at most once a second: here at once)."""
    from zmq.utils import z85

    from ctxwin.daemon import _auth

    server = tmp_path / "server"
    keys("server", "--dir", str(server))
    publics = []
    for name in ("one", "two"):
        keys("client", name, "--dir", str(tmp_path / name))
        publics.append(proto.read_key_file(tmp_path / name / "client.key").public)
    keys("allow", str(tmp_path / "one" / "client.key"), "--name", "one", "--dir", str(server))
    reads: list[Path] = []
    real = _auth.read_allowed

    def counted(directory: Path) -> tuple[dict[bytes, str], dict[str, str]]:
        reads.append(directory)
        return real(directory)

    monkeypatch.setattr(_auth, "read_allowed", counted)
    listings: list[Path] = []
    real_listing = _auth._listing

    def listed(directory: Path) -> tuple[object, ...] | None:
        listings.append(directory)
        return real_listing(directory)

    monkeypatch.setattr(_auth, "_listing", listed)

    def handshake(auth: _auth.Authenticator, public: bytes) -> bytes:
        request = [b"1.0", b"7", b"ctxwind", b"127.0.0.1", b"", b"CURVE", z85.decode(public)]
        return auth._answer(request)[2]

    async def run() -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        auth = _auth.Authenticator(context, load_server_keys(server), {})
        try:
            assert len(reads) == 1  # at start
            for _ in range(20):
                assert handshake(auth, publics[0]) == b"200"
                assert handshake(auth, publics[1]) == b"400"
            assert len(reads) == 1
            assert len(listings) == 1  # within a second: the directory's status only
            keys(
                "allow", str(tmp_path / "two" / "client.key"), "--name", "two", "--dir", str(server)
            )
            assert handshake(auth, publics[1]) == b"200"
            assert len(reads) == 2
            monkeypatch.setattr(_auth, "RELIST_S", 0.0)  # the second is up
            for _ in range(5):  # the files looked at again, unchanged: not read
                assert handshake(auth, publics[0]) == b"200"
            assert len(reads) == 2
            assert len(listings) == 7
            os.chmod(server / "allowed" / "two.key", 0o666)  # the directory is unchanged
            assert handshake(auth, publics[1]) == b"400"
            assert len(reads) == 3
        finally:
            auth.close()
            context.term()

    asyncio.run(run())
