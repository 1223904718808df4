"""The page's style sheet and script are files of its package, and every page carries them."""

from __future__ import annotations

import re
from importlib import resources

from ctxwin.client.cli.page import inspect_page
from ctxwin.client.cli.replay import TokenCounts, ViewState

MARKERS = ("/* range */\n", "/* order */\n", "/* end */\n")
HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "the task"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "on it"}]},
    {"role": "user", "content": [{"type": "text", "text": "and then"}]},
]


def _asset(name: str) -> str:
    return resources.files("ctxwin.client.cli.page").joinpath(name).read_text(encoding="utf-8")


def _script(page: str) -> str:
    found = re.search(r"<script>\n(.*?)</script>", page, re.DOTALL)
    assert found is not None, "the page has no inline script"
    return found.group(1)


def test_the_package_holds_the_style_sheet_and_script_every_page_carries() -> None:
    """page.css and page.js are read from the installed package (an editable install reads
    the checkout's): the style sheet goes into each page whole, the script with the one way
    of showing a turn its views need (a range, or an order) and none of its marker lines."""
    style, script = _asset("page.css"), _asset("page.js")
    assert style.startswith(":root{")
    assert [1, 1, 1] == [script.count(marker) for marker in MARKERS]
    head, rest = script.split(MARKERS[0])
    counts = TokenCounts([5, 3, 4], [])
    ranged = inspect_page("t", HISTORY, ViewState(None), [], counts, [])
    ordered = inspect_page(
        "t", HISTORY, ViewState(None, order=[(0, None), (2, None)]), [], counts, [],
        dialect="openai-chat",
    )  # fmt: skip
    for page in (ranged, ordered):
        assert f"<style>\n{style}</style>" in page
        assert _script(page).startswith(head)
        assert _script(page).endswith(rest.split(MARKERS[2])[1])
        assert not any(marker.strip() in page for marker in MARKERS)
    assert "i >= view.keep" in _script(ranged)
    assert "view.order" not in _script(ranged)
    assert "order = view.order" in _script(ordered)
    assert "view.keep" not in _script(ordered)
