#!/usr/bin/env python3
"""Set up .venv/ and run ctxwin's two everyday commands.

    python3 dev.py daemon [ctxwind flags...]   start ctxwind on its defaults
    python3 dev.py test [pytest args...]       lint, type-check and test
    python3 dev.py setup                       only create/refresh .venv/ (all of it)

Each command first makes sure `.venv/` at the repository root exists and holds
what that command needs, and says what it installs:

    daemon   the three distributions (proto, client, daemon) installed editable,
             with their dependencies
    test     the same, plus the development tools listed in pyproject.toml's
             [dependency-groups] (pytest, ruff, mypy, the SDKs the tests drive, ...)

Each part has a stamp in .venv/ and is skipped while nothing it depends on has
changed since it was installed, so `daemon` never waits for the test tools and
`test` installs them once.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import venv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
DISTRIBUTIONS = ("proto", "client", "daemon")


@dataclass(frozen=True)
class Part:
    """One installable part of .venv/: what it is, what it installs, when it is current.

    Attributes:
        name: the stamp's suffix (``runtime``, ``dev``).
        what: what it installs, as said on the terminal.
        requirements: pip's arguments for it.
        inputs: the files whose content (with the requirements and the Python
            version) decides whether it is current.
        command: a program of .venv/bin/ it installs (missing: not installed).
    """

    name: str
    what: str
    requirements: tuple[str, ...]
    inputs: tuple[Path, ...]
    command: str

    def stamp(self, venv_dir: Path) -> Path:
        return venv_dir / f".ctxwin-setup-{self.name}"

    def fingerprint(self) -> str:
        digest = hashlib.sha256(sys.version.encode())
        digest.update("\0".join(self.requirements).encode())
        for path in self.inputs:
            digest.update(path.read_bytes())
        return digest.hexdigest()

    def current(self, venv_dir: Path) -> bool:
        stamp = self.stamp(venv_dir)
        return (
            stamp.exists()
            and stamp.read_text() == self.fingerprint()
            and (_bin(venv_dir) / self.command).exists()
        )


def _bin(venv_dir: Path) -> Path:
    return venv_dir / ("Scripts" if os.name == "nt" else "bin")


def parts(root: Path = ROOT) -> dict[str, Part]:
    """The parts of .venv/, by name, read from the checkout at ``root``."""
    import tomllib  # here, so that an old Python gets the message in main() instead

    dev = tomllib.loads((root / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    editable = [arg for name in DISTRIBUTIONS for arg in ("-e", f"./{name}")]
    return {
        "runtime": Part(
            "runtime",
            "proto, client and daemon (editable) and their dependencies",
            tuple(editable),
            tuple(root / name / "pyproject.toml" for name in DISTRIBUTIONS),
            "ctxwind",
        ),
        "dev": Part(
            "dev",
            f"the development tools ({len(dev)} from pyproject.toml: pytest, ruff, mypy, "
            "the SDKs the tests drive, ...)",
            tuple(dev),
            (root / "pyproject.toml",),
            "pytest",
        ),
    }


NEEDS: dict[str, tuple[str, ...]] = {
    "daemon": ("runtime",),
    "test": ("runtime", "dev"),
    "setup": ("runtime", "dev"),
}
"""The parts each command needs."""


def plan(command: str, root: Path = ROOT, venv_dir: Path | None = None) -> list[Part]:
    """The parts ``command`` needs that are not installed and current in ``venv_dir``."""
    venv_dir = root / ".venv" if venv_dir is None else venv_dir
    known = parts(root)
    return [known[name] for name in NEEDS[command] if not known[name].current(venv_dir)]


def _say(text: str) -> None:
    sys.stderr.write(f"dev.py: {text}\n")
    sys.stderr.flush()


class _Progress:
    """pip's output condensed: a line redrawn per package on a terminal, a summary at the end."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.collected = 0
        self.installed: list[str] = []
        self.shown = 0

    def line(self, text: str) -> None:
        if text.startswith("Collecting "):
            self.collected += 1
            self.show(f"resolving: {self.collected} package(s), {text.split()[1]}")
        elif text.startswith("Installing collected packages"):
            self.show("installing ...")
        elif text.startswith("Successfully installed "):
            self.installed = text.split()[2:]

    def show(self, text: str) -> None:
        if self.live:
            line = f"dev.py:   {text}"[:79]
            self.stream.write("\r" + line.ljust(self.shown))
            self.shown = len(line)
            self.stream.flush()

    def clear(self) -> None:
        if self.live and self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0


def _pip_install(python: Path, requirements: Sequence[str]) -> int:
    """Run pip, condensing its output; return how many packages it installed."""
    argv = [
        os.fspath(python), "-m", "pip", "install", "--disable-pip-version-check",
        "--progress-bar", "off", *requirements,
    ]  # fmt: skip
    progress = _Progress(sys.stderr)
    kept: list[str] = []
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True) as pip:
        assert pip.stdout is not None
        try:
            for raw in pip.stdout:
                kept = [*kept[-39:], raw]
                progress.line(raw.strip())
        finally:
            progress.clear()
        code = pip.wait()
    if code != 0:
        sys.stderr.writelines(kept)
        _say(f"pip failed ({code}): {' '.join(argv[1:])}")
        sys.exit(code)
    return len(progress.installed)


def setup(command: str = "setup") -> None:
    """Create .venv/ and install what ``command`` needs into it, unless already current."""
    missing = plan(command)
    if not missing:
        return
    python = _bin(VENV) / "python"
    if not python.exists():
        _say(f"creating {VENV} (Python {sys.version.split()[0]})")
        venv.EnvBuilder(with_pip=True, upgrade_deps=False).create(VENV)
    started = time.monotonic()
    _say(
        f"installing {', plus '.join(part.what for part in missing)} into {VENV} "
        "(the first time takes a minute or more)"
    )
    count = _pip_install(python, [arg for part in missing for arg in part.requirements])
    for part in missing:
        part.stamp(VENV).write_text(part.fingerprint())
    (VENV / ".ctxwin-setup").unlink(missing_ok=True)  # the single stamp of older versions
    done = f"installed {count} package(s)" if count else "nothing new to install: up to date"
    _say(f"{done} in {time.monotonic() - started:.0f} s")


def _parallel(args: list[str]) -> list[str]:
    """pytest-xdist options: a worker per CPU, each test file on one worker.

    A file's tests stay together so that a daemon a module shares starts once.
    Given ``-n``/``--numprocesses`` or ``-p no:xdist``, the caller decides.
    """
    if any(
        a in {"-n", "--numprocesses", "no:xdist"} or a.startswith(("-n", "--numprocesses="))
        for a in args
    ):
        return []
    return ["-n", "auto", "--dist", "loadfile"]


def _python_files(root: Path, paths: Sequence[str]) -> int:
    """How many ``.py`` files ``paths`` (files or folders under ``root``) hold."""
    count = 0
    for name in paths:
        path = root / name
        count += path.suffix == ".py" if path.is_file() else len(list(path.rglob("*.py")))
    return count


def _test_files(root: Path, args: Sequence[str]) -> str:
    """What pytest is given: the test files of ``tests/`` when no path is among ``args``."""
    if any((root / arg.split("::")[0]).exists() for arg in args if not arg.startswith("-")):
        return "the tests given"
    return f"{len(list((root / 'tests').glob('test_*.py')))} test files, several minutes"


@dataclass(frozen=True)
class Step:
    """One step of ``test``: what it is, said before it starts, and its command."""

    what: str
    argv: list[str | os.PathLike[str]]


def check_steps(args: list[str], root: Path = ROOT, venv_dir: Path = VENV) -> list[Step]:
    """The steps of ``test``, each saying what it does and about how long it takes."""
    import tomllib  # here, so that an old Python gets the message in main() instead

    bin_dir = _bin(venv_dir)
    config = tomllib.loads((root / "pyproject.toml").read_text())
    typed = _python_files(root, config["tool"]["mypy"]["files"])
    workers = f", a worker per CPU ({os.cpu_count()})" if _parallel(args) else ""
    corpus = os.environ.get("CTXWIN_CORPUS", "").strip()
    real = (
        f"with the real conversations of CTXWIN_CORPUS={corpus}"
        if corpus
        else "tests over real conversations skip: CTXWIN_CORPUS is unset (README, Tests)"
    )
    return [
        Step("lint: ruff check (seconds)", [bin_dir / "ruff", "check", "."]),
        Step("format: ruff format --check (seconds)", [bin_dir / "ruff", "format", "--check", "."]),
        Step(
            f"type-checking {typed} files: mypy --strict (about a minute, silent until done)",
            [bin_dir / "mypy"],
        ),
        Step(
            f"testing: pytest over {_test_files(root, args)}{workers}; {real}",
            [bin_dir / "python", "-m", "pytest", *_parallel(args), *args],
        ),
    ]


def test(args: list[str]) -> int:
    """Lint, type-check, then run the test suite; the first failure stops the run. Each
    step says what it does before it starts, and how long it took."""
    steps = check_steps(args)
    for number, step in enumerate(steps, 1):
        _say(f"[{number}/{len(steps)}] {step.what}")
        started = time.monotonic()
        code = subprocess.run([os.fspath(a) for a in step.argv], cwd=ROOT, check=False).returncode
        took = time.monotonic() - started
        if code != 0:
            _say(f"[{number}/{len(steps)}] failed (exit {code}) after {took:.0f} s")
            return code
        _say(f"[{number}/{len(steps)}] passed in {took:.0f} s")
    return 0


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - explain instead of failing on an import
        _say("Python 3.11 or newer is required")
        return 2
    if not argv or argv[0] in {"-h", "--help", "help"}:
        sys.stdout.write(__doc__ or "")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in NEEDS:
        _say(f"unknown command {command!r}; expected daemon, test or setup")
        return 2
    try:
        setup(command)
    except KeyboardInterrupt:
        _say("interrupted; the next run installs again what was not finished")
        return 130
    if command == "setup":
        return 0
    if command == "daemon":
        ctxwind = os.fspath(_bin(VENV) / "ctxwind")
        _say(f"starting {ctxwind} {' '.join(rest)}".rstrip())
        os.execv(ctxwind, [ctxwind, *rest])
    return test(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
