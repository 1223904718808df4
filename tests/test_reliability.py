"""Reliability in CI: disk faults, privileges, descriptor limits, access and floods (issue 8).

The long runs with figures are the scripts in ``bench/reliability/``; these
tests run the same scenarios at a size that fits CI. They need root (mounts,
chattr, setpriv, capsh, strace); a scenario is skipped, with the reason, only
when the kernel or a missing tool refuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.reliability import access, crash, descriptors, faults, flood
from bench.reliability._harness import NOBODY, REPO, Client, Daemon, as_uid, closed_dirs, scratch

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="needs root on Linux (mount, chattr, setpriv, capsh, strace)",
)


def needs(tool: str) -> None:
    """Skip, naming ``tool``, when it is not installed (``.ci/run`` installs it as root)."""
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (.ci/run installs it with apt-get as root)")


def needs_open_checkout() -> None:
    """Skip when the checkout itself is closed to other users (cloned straight into a 0700 dir).

    A daemon run as another uid runs this checkout's code; a closed directory
    above the checkout is opened for it in a mount namespace, the checkout's
    own mode cannot be.
    """
    if REPO in closed_dirs(REPO):
        pytest.skip(f"{REPO} is closed to other users: `chmod o+x {REPO}` to run this test")


# ENOSPC, RLIMIT_FSIZE and a read-only bind mount are covered by test_daemon_faults.py;
# bench/reliability/faults.py runs all of them.
CI_FAULTS = ["eio-fsync", "exdev-rename", "eperm-chattr", "eacces-setpriv", "eacces-capsh"]


@pytest.mark.parametrize("name", CI_FAULTS)
def test_a_disk_fault_is_logged_answered_through_and_recovered(name: str, tmp_path: Path) -> None:
    """Under the fault a change succeeds, flush fails naming the errno, pings are answered,
    the files stay old-or-new with no temp file, and the next flush after the fault succeeds."""
    if name == "eacces-setpriv":
        needs_open_checkout()
    outcome = faults.run_fault(faults.FAULTS[name], tmp_path)
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    assert outcome.change_answered
    assert "internal" == outcome.flush_code
    assert f"({outcome.errno})" in outcome.flush_message
    assert outcome.logged, "no write_failed event with the task id, errno and a retry"
    assert [] == outcome.ping_failures
    assert outcome.pings_answered > 0
    assert outcome.history_unchanged
    assert outcome.files_old_or_new
    assert [] == outcome.temp_files_during
    assert outcome.recovered
    assert [] == outcome.temp_files_after
    assert 0 == outcome.stop_code


def test_the_daemon_runs_as_the_uid_setpriv_gives_it() -> None:
    """The EACCES scenario really runs the daemon as uid 65534, not as root."""
    needs("setpriv")
    needs_open_checkout()
    with scratch("ctxwin-uid-", owner=NOBODY) as root:
        home = {"HOME": str(root / "run"), "XDG_CONFIG_HOME": str(root / "run")}
        daemon = Daemon(root, env=home, prefix=as_uid(NOBODY, root / "stage"))
        daemon.start()
        try:
            status = Path(f"/proc/{daemon.pid}/status").read_text()
            uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
            assert ["65534"] * 4 == uids
        finally:
            assert 0 == daemon.stop()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_open_files_limit_64_and_128_clients_do_not_abort(tmp_path: Path, transport: str) -> None:
    """With 64 open files and 128 ipc or loopback TCP clients the daemon stays up, answers,
    and writes."""
    daemon, endpoint = descriptors.limited_daemon(tmp_path, 64, transport)
    daemon.start()
    try:
        result = descriptors.run_round(daemon, endpoint, 128, wait=1.0)
        assert 64 == result.limit_in_daemon
        assert result.alive_under_pressure
        assert result.answered_under_pressure > 0
        assert result.answered_after
        assert result.flushed_after
        assert result.alive_after
        assert daemon.events("accept_paused"), "the daemon never stopped accepting"
    finally:
        assert 0 == daemon.stop()
    assert "Too many open files" not in daemon.log()


def test_an_open_files_limit_too_low_for_any_client_is_refused_at_start(tmp_path: Path) -> None:
    """A hard open-files limit of 24 stops the daemon at start with the limit it needs."""
    daemon, _ = descriptors.limited_daemon(tmp_path, 24, "ipc")
    proc = daemon.run_to_exit()
    assert 1 == proc.returncode
    assert "ctxwind: the open-files limit (24) is too low" in proc.stderr
    assert "ctxwind needs a limit of at least" in proc.stderr


@pytest.mark.parametrize("layout", ["xdg", "tmpdir"])
def test_another_uid_cannot_reach_the_default_ipc_endpoint(layout: str) -> None:
    """The default socket is in a 0700 dir (tightened if it was wider): uid 65534 gets EACCES."""
    needs("setpriv")
    needs_open_checkout()
    with scratch("ctxwin-access-") as root:
        root.chmod(0o755)
        outcome = access.check_default_ipc(root, layout, wait=0.5)
    assert "0o700" == outcome.dir_mode
    assert "0o600" == outcome.socket_mode
    assert outcome.owner_ping
    assert {"uid": NOBODY, "connect": "EACCES", "zmq": "no reply"} == outcome.other_uid


def test_a_default_socket_dir_owned_by_another_uid_is_refused() -> None:
    """A pre-created $TMPDIR/ctxwin-<uid> owned by another uid (0777) is not used for the socket."""
    with scratch("ctxwin-foreign-") as root:
        root.chmod(0o755)
        outcome = access.check_foreign_dir(root)
    assert not outcome.started, outcome.detail


def test_tcp_endpoints_bind_loopback_and_wildcards_are_refused(tmp_path: Path) -> None:
    """localhost and 127.0.0.1 endpoints listen on 127.0.0.1 only; *, 0.0.0.0 and [::] exit 2."""
    outcome = access.check_tcp(tmp_path)
    assert len(outcome.endpoints) == len(outcome.listening)
    assert all(item.startswith("127.0.0.1:") for item in outcome.listening), outcome.listening
    assert all(reason.startswith("exit 2") for reason in outcome.refused.values()), outcome.refused


def test_oversize_frames_cost_the_connection_and_are_never_handled(tmp_path: Path) -> None:
    """Each frame over --max-bytes drops the sender's connection and never reaches a handler."""
    daemon = Daemon(tmp_path, "--max-bytes", "65536")
    daemon.start()
    try:
        counted = flood.oversize_never_decoded(daemon.endpoint, 10, 65536)
        assert {"sent": 10, "disconnects": 10, "replies": 0, "requests_handled": 0} == counted
        assert daemon.call("ping").ok
    finally:
        assert 0 == daemon.stop()


def test_the_crash_writer_steps_through_its_tasks_without_a_refusal(tmp_path: Path) -> None:
    """The crash bench's writer gets every request taken across a change of task, and a
    flushed task's last step is on disk with its notice."""
    with Daemon(tmp_path, "--log-level", "warning") as daemon:
        records = tmp_path / "w.acks"
        crash.writer(daemon.endpoint, "w", records, 1.5, flush_every=5, per_task=10)
    log = crash.AckLog(records)
    log.read()
    assert log.refusals == []
    assert max(ack.step for ack in log.pending) > 10  # the writer went on with task w-1
    disk = crash.read_disk(daemon.task_dir("w-0"), crash.first_step("w-0", 10))
    assert isinstance(disk, crash.DiskState)
    assert (disk.step, disk.notice) == (10, 10)
    assert crash.one_state(disk) is None


def test_a_flooder_is_refused_while_another_client_keeps_being_answered(tmp_path: Path) -> None:
    """While one process floods oversize and many-frame messages, pings are all answered quickly
    and the flooder only ever gets too_large."""
    daemon = Daemon(tmp_path, "--max-bytes", "262144", "--log-level", "warning")
    daemon.start()
    flooder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.reliability.flood",
            "--role",
            "flooder",
            "--endpoint",
            daemon.endpoint,
            "--seconds",
            "3",
            "--max-bytes",
            "262144",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    client = Client(daemon.endpoint)
    try:
        latencies = []
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            started = time.perf_counter()
            assert client.call("ping", timeout=5).ok
            latencies.append(time.perf_counter() - started)
        out, _ = flooder.communicate(timeout=60)
        result = json.loads(out.strip().splitlines()[-1])
        assert result["sent"]["many_frames"] > 0
        assert set(result["replies"]) == {"too_large"}
        # Liveness only: every ping above was answered within its timeout while
        # the flood ran; its latency is measured by bench/reliability/flood.py.
        assert len(latencies) >= 10
        assert daemon.alive()
    finally:
        client.close()
        if flooder.poll() is None:
            flooder.kill()
            flooder.wait()
        assert 0 == daemon.stop()
