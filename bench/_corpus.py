"""Where a bench finds the real conversations: ``--corpus`` or ``CTXWIN_CORPUS``.

The corpus (other people's agent logs) is kept outside the repository; a bench
that replays it is given its folder by ``--corpus FOLDER`` or by the
environment variable ``CTXWIN_CORPUS`` (the one the tests read), and stops with
an error naming both when neither is given.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["CLINE_TASK", "VARIABLE", "add_corpus_option", "corpus_file", "corpus_folder"]

VARIABLE = "CTXWIN_CORPUS"
CLINE_TASK = "mra-api_conversation_history.json"
"""The real Cline task the single-conversation benches replay."""


class CorpusMissing(SystemExit):
    """No corpus given, or not where it was said to be: the bench stops, saying so."""


def add_corpus_option(parser: argparse.ArgumentParser, replayed: str | None = None) -> None:
    """Add ``--corpus``: the corpus folder, by default ``$CTXWIN_CORPUS``; where a bench
    replays one conversation (``replayed``, a file of the folder), that file itself too."""
    if replayed is None:
        what, metavar = "the folder of the real conversations", "FOLDER"
    else:
        what, metavar = f"the folder of the real conversations (its {replayed}) or a file", "PATH"
    parser.add_argument(
        "--corpus", type=Path, default=None, metavar=metavar, help=f"{what}; default ${VARIABLE}"
    )


def corpus_folder(given: Path | None, otherwise: str = "") -> Path:
    """The corpus folder: ``given`` (``--corpus``), else ``$CTXWIN_CORPUS``; ``otherwise``
    what else the bench can do without one, said in the error.

    Raises:
        CorpusMissing: neither names one, or it is not a folder.
    """
    named = os.environ.get(VARIABLE, "").strip()
    folder = given if given is not None else (Path(named).expanduser() if named else None)
    if folder is None:
        raise CorpusMissing(
            f"no corpus: give --corpus FOLDER or set {VARIABLE}=FOLDER "
            "(the folder of the real conversations, kept outside the repository)"
            + (f", or {otherwise}" if otherwise else "")
        )
    if not folder.is_dir():
        source = "--corpus" if given is not None else VARIABLE
        raise CorpusMissing(f"{folder} (from {source}) is not a folder")
    return folder


def corpus_file(given: Path | None, name: str, otherwise: str = "") -> Path:
    """The conversation ``name`` of the corpus folder; ``given`` may also be a file itself.

    Raises:
        CorpusMissing: no corpus is given, or it holds no ``name``.
    """
    if given is not None and given.is_file():
        return given
    path = corpus_folder(given, otherwise) / name
    if not path.is_file():
        raise CorpusMissing(f"the corpus folder holds no {name}: {path} is not a file")
    return path
