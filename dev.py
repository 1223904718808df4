#!/usr/bin/env python3
"""Set up .venv/ and run ctxwin's two everyday commands.

    python3 dev.py daemon [ctxwind flags...]   start ctxwind on its defaults
    python3 dev.py test [pytest args...]       lint, type-check and test
    python3 dev.py setup                       only create/refresh .venv/

Both commands first make sure `.venv/` at the repository root exists and holds
the three distributions (proto, client, daemon) installed editable plus the
development tools listed in pyproject.toml's [dependency-groups]. The set-up is
skipped when nothing it depends on has changed since the last run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".ctxwin-setup"
INPUTS = [
    ROOT / "pyproject.toml",
    ROOT / "proto" / "pyproject.toml",
    ROOT / "client" / "pyproject.toml",
    ROOT / "daemon" / "pyproject.toml",
    Path(__file__).resolve(),
]


def _say(text: str) -> None:
    sys.stderr.write(f"dev.py: {text}\n")
    sys.stderr.flush()


def _fingerprint() -> str:
    digest = hashlib.sha256(sys.version.encode())
    for path in INPUTS:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _run(*argv: str | os.PathLike[str]) -> None:
    result = subprocess.run([os.fspath(a) for a in argv], cwd=ROOT, check=False)
    if result.returncode != 0:
        _say(f"command failed ({result.returncode}): {' '.join(map(str, argv))}")
        sys.exit(result.returncode)


def setup() -> None:
    """Create .venv/ and install everything into it, unless already current."""
    fingerprint = _fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint and (BIN / "ctxwind").exists():
        return
    if not (BIN / "python").exists():
        _say(f"creating {VENV}")
        venv.EnvBuilder(with_pip=True, upgrade_deps=False).create(VENV)
    python = BIN / "python"
    import tomllib  # here, so that an old Python gets the message in main() instead

    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    _say("installing proto, client and daemon (editable) and the development tools")
    _run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "-e",
        "./proto",
        "-e",
        "./client",
        "-e",
        "./daemon",
        *dev,
    )
    STAMP.write_text(fingerprint)


def test(args: list[str]) -> int:
    """Lint, type-check, then run the test suite; the first failure stops the run."""
    steps: list[list[str | os.PathLike[str]]] = [
        [BIN / "ruff", "check", "."],
        [BIN / "ruff", "format", "--check", "."],
        [BIN / "mypy"],
        [BIN / "python", "-m", "pytest", *args],
    ]
    for step in steps:
        _say(
            "running "
            + " ".join(Path(str(step[0])).name if i == 0 else str(a) for i, a in enumerate(step))
        )
        code = subprocess.run([os.fspath(a) for a in step], cwd=ROOT, check=False).returncode
        if code != 0:
            return code
    return 0


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - explain instead of failing on an import
        _say("Python 3.11 or newer is required")
        return 2
    if not argv or argv[0] in {"-h", "--help", "help"}:
        sys.stdout.write(__doc__ or "")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in {"daemon", "test", "setup"}:
        _say(f"unknown command {command!r}; expected daemon, test or setup")
        return 2
    setup()
    if command == "setup":
        return 0
    if command == "daemon":
        ctxwind = os.fspath(BIN / "ctxwind")
        os.execv(ctxwind, [ctxwind, *rest])
    return test(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
