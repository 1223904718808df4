"""dev.py installs what each command needs, says so, and starts the daemon from any checkout."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import dev
import pytest

from tests._daemon import call

ROOT = Path(__file__).resolve().parents[1]
EDITABLE = ["-e", "./proto", "-e", "./client", "-e", "./daemon"]
TEST_TOOLS = ("pytest", "ruff", "mypy", "hypothesis")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files dev.py reads, copied into a checkout of their own."""
    root = tmp_path / "checkout"
    for name in ("pyproject.toml", *(f"{d}/pyproject.toml" for d in dev.DISTRIBUTIONS)):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    return root


def _names(parts: list[dev.Part]) -> list[str]:
    return [part.name for part in parts]


def _installed(root: Path, name: str, program: str) -> None:
    """Mark a part as installed in root/.venv, as dev.py does after pip succeeds."""
    part = dev.parts(root)[name]
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / program).touch()
    part.stamp(root / ".venv").write_text(part.fingerprint())


def test_the_daemon_needs_the_three_distributions_only(checkout: Path) -> None:
    """``daemon`` installs proto, client and daemon editable; none of the test tools."""
    (runtime,) = dev.plan("daemon", checkout)
    assert ("runtime", EDITABLE) == (runtime.name, list(runtime.requirements))
    assert not any(tool in arg for arg in runtime.requirements for tool in TEST_TOOLS)


def test_test_adds_the_development_tools(checkout: Path) -> None:
    """``test`` (and ``setup``) add pyproject.toml's dev group to what ``daemon`` installs."""
    group = tomllib.loads((checkout / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    for command in ("test", "setup"):
        runtime, tools = dev.plan(command, checkout)
        assert ("runtime", "dev") == (runtime.name, tools.name)
        assert group == list(tools.requirements)
    assert all(any(arg.startswith(tool) for arg in group) for tool in TEST_TOOLS)


def test_each_part_is_installed_once_until_what_it_depends_on_changes(checkout: Path) -> None:
    """A stamp per part: the daemon's install is kept when only the test tools change."""
    _installed(checkout, "runtime", "ctxwind")
    assert ([], ["dev"]) == (dev.plan("daemon", checkout), _names(dev.plan("test", checkout)))
    _installed(checkout, "dev", "pytest")
    assert ([], []) == (dev.plan("daemon", checkout), dev.plan("test", checkout))
    root_file = checkout / "pyproject.toml"
    root_file.write_text(root_file.read_text() + "\n# a new tool\n")
    assert ([], ["dev"]) == (dev.plan("daemon", checkout), _names(dev.plan("test", checkout)))
    daemon_file = checkout / "daemon" / "pyproject.toml"
    daemon_file.write_text(daemon_file.read_text() + "\n# a new dependency\n")
    assert ["runtime"] == _names(dev.plan("daemon", checkout))
    (checkout / ".venv" / "bin" / "pytest").unlink()  # a tool removed by hand
    assert ["runtime", "dev"] == _names(dev.plan("test", checkout))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_dev_test_says_what_each_step_does_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each step is named (mypy with its file count and its minute) before its command runs,
    its time after; a failing step stops the run and says so."""
    said: list[tuple[str, str]] = []
    codes = {"pytest": 1}

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        name = Path(argv[0]).name if argv[0] != str(dev._bin(dev.VENV) / "python") else argv[2]
        said.append(("run", name))
        return subprocess.CompletedProcess(argv, codes.get(name, 0))

    monkeypatch.setattr(dev, "_say", lambda text: said.append(("say", text)))
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.delenv("CTXWIN_CORPUS", raising=False)
    assert 1 == dev.test([])
    typed = sum(
        1 if (ROOT / name).is_file() else len(list((ROOT / name).rglob("*.py")))
        for name in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    )
    steps = [
        ("ruff", "[1/4] lint: ruff check"),
        ("ruff", "[2/4] format: ruff format --check"),
        ("mypy", f"[3/4] type-checking {typed} files: mypy --strict (about a minute"),
        ("pytest", "[4/4] testing: pytest over "),
    ]
    for number, (program, opening) in enumerate(steps):
        before, ran, after = said[3 * number : 3 * number + 3]
        assert before[0] == "say"
        assert before[1].startswith(opening)
        assert ("run", program) == ran
        assert after[0] == "say"
        assert re.fullmatch(
            rf"\[{number + 1}/4\] (passed in|failed \(exit 1\) after) \d+ s", after[1]
        )
    assert "CTXWIN_CORPUS is unset (README, Tests)" in said[9][1]
    assert said[-1][1].startswith("[4/4] failed (exit 1) after")
    codes["ruff"] = 2
    said.clear()
    assert 2 == dev.test(["tests/test_dev.py"])
    assert [("run", "ruff")] == [item for item in said if item[0] == "run"]


def test_pip_output_becomes_one_line_redrawn_then_blanked() -> None:
    """On a terminal each package redraws one line, which is blanked once pip is done."""
    stream = _Terminal()
    progress = dev._Progress(stream)
    for line in (
        "Collecting pyzmq>=25",
        "  Using cached pyzmq-27.0.0.whl",
        "Collecting msgpack>=1.0",
        "Installing collected packages: msgpack, pyzmq",
        "Successfully installed msgpack-1.1.0 pyzmq-27.0.0",
    ):
        progress.line(line)
    progress.clear()
    frames = stream.getvalue().split("\r")[1:]
    assert "resolving: 2 package(s), msgpack>=1.0" in frames[1]
    assert "\n" not in stream.getvalue()
    assert ("", "") == (frames[-2].strip(), frames[-1])  # blanked, the cursor at its start
    assert 2 == len(progress.installed)
    quiet = io.StringIO()
    dev._Progress(quiet).line("Collecting pyzmq>=25")
    assert "" == quiet.getvalue()  # a log gets the summary lines only


def test_dev_daemon_starts_the_daemon_in_a_private_home_without_xdg_dirs(tmp_path: Path) -> None:
    """``python3 dev.py daemon`` with nothing to install says so little, and serves on its defaults.

    HOME is a private (0700) directory and no XDG variable is set, so the daemon
    takes its fallbacks: the socket under the temp dir, the state under HOME.
    """
    if dev.plan("daemon"):
        pytest.skip("this checkout's .venv is not set up (python3 dev.py setup)")
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    temp = tmp_path / "t"
    temp.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("XDG_") and key not in {"CTXWIN_ENDPOINT", "VIRTUAL_ENV"}
    }
    env.update(HOME=str(home), TMPDIR=str(temp))
    python = getattr(sys, "_base_executable", sys.executable)
    process = subprocess.Popen(
        [python, str(ROOT / "dev.py"), "daemon"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    endpoint = f"ipc://{temp / f'ctxwin-{os.getuid()}' / 'ctxwind.sock'}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()[1]
            try:
                if call(endpoint, "ping", timeout=0.5).ok:
                    break
            except TimeoutError:
                pass
            assert time.monotonic() < deadline, "no daemon answered at " + endpoint
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert 0 == process.returncode, err
    assert f"dev.py: starting {ROOT / '.venv' / 'bin' / 'ctxwind'}" in err
    assert "installing" not in err
    assert (home / ".local" / "state" / "ctxwin").is_dir()
