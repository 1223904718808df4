"""The model provider the integration examples talk to: a real one, or the checkout's fake.

With ``--base-url`` the examples use that provider (and the SDK's usual API
key variable). Without it they start the local fake provider of the test
suite (``tests/_fake_provider.py``: it plays OpenAI and Anthropic on
127.0.0.1, asks for ``read_file`` calls, on ``src/app.py`` again and again and
on other files in between, and refuses prompts over ``limit`` tokens with the
provider's real error), so they run in a checkout with no network and no key.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from ctxwin.client.integrations import Turn

ROOT = Path(__file__).resolve().parents[2]

READS = tuple("src/app.py" if turn % 4 == 0 else f"src/mod{turn}.py" for turn in range(40))
"""What the fake model reads: ``src/app.py`` every fourth turn, another module in between."""


def read_file(path: str) -> str:
    """The example's tool: the text of a project file (made up, about 400 tokens)."""
    return f"# {path}\n" + "def compute(n):\n    return n * 2  # should be n + 1\n" * 40


def report(turn: Turn) -> None:
    """Print a line for each model request at which ctxwin cut the view again (the ``on_turn``
    hook): ``cline`` and ``fit`` move the deleted range; ``auto``, the adapters' default, leaves
    whole turns out of the view (its deleted set, shown by ``ctxwin inspect``) and keeps the
    range as it was."""
    if turn.range_updated:
        cut = f"range {turn.deleted_range}" if turn.deleted_range else "older turns left out"
        print(
            f"[{turn.task}] sent {turn.sent} of {turn.messages} messages, {cut}"
            f"{' after a context-window error' if turn.retried else ''}"
        )


def arguments(description: str | None) -> argparse.Namespace:
    """``--endpoint`` (the ctxwin daemon), ``--base-url`` (the provider), ``--turns``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--endpoint", help="ctxwin daemon endpoint (default: $CTXWIN_ENDPOINT, else the default)"
    )
    parser.add_argument("--base-url", help="the provider's base URL (default: the local fake)")
    parser.add_argument(
        "--turns", type=int, default=40, help="tool calls the fake model makes (default 40)"
    )
    return parser.parse_args()


@contextlib.contextmanager
def provider(base_url: str | None, *, limit: int, tool_turns: int) -> Iterator[str]:
    """Yield the provider's base URL (without ``/v1``): ``base_url``, or a fake's while it runs."""
    if base_url is not None:
        yield base_url.removesuffix("/v1")
        return
    sys.path.insert(0, str(ROOT))
    from tests._fake_provider import FakeProvider

    with FakeProvider(limit=limit, tool_turns=tool_turns, paths=READS) as fake:
        yield fake.url
