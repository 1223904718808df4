"""The ``--html`` page of a Cline task's replay, loaded in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from ctxwin.client import Client
from ctxwin.client.cli._corpus import load_history
from ctxwin.client.cli._dialects import chars_of
from ctxwin.client.cli.page import write_page
from ctxwin.client.cli.page._layout import Page, PageTurn
from ctxwin.client.cli.page._layout import render as render_page
from ctxwin.client.cli.replay import TokenCounts, ViewState
from tests._daemon import DaemonProcess
from tests._png import read_png
from tests._shapes import conversation_file
from tests.test_auto_wire import render
from tests.test_cli import CLINE_TASKS, REAL_TASK, run


@pytest.fixture
def browser() -> str:
    """The browser, or a skip (a failure in CI, where .ci/run installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CTXWIN_CI") == "1":
            pytest.fail("chromium is missing: .ci/run should have installed Debian's chromium")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def _browse(browser: str, profile: Path, url: str, *action: str) -> str:
    """Run headless Chromium on ``url`` with no network use; its stdout."""
    argv = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        *action,
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert 0 == done.returncode, done.stderr[-2000:]
    return done.stdout


class _Dom(HTMLParser):
    """What a test reads back from the rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[tuple[int, str | None]] = []  # (index, variant) of visible messages
        self.fold: str | None = None
        self.fold_hidden = True
        self.gaps: list[str] = []  # the lines of the deleted set's runs shown
        self.sequence: list[int | str] = []  # messages and lines shown, in page order
        self.events: list[list[str]] = []
        self.summary = ""
        self._into: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        classes = (found.get("class") or "").split()
        if tag == "li" and "msg" in classes and "hidden" not in found:
            self.shown.append((int(found["data-i"] or -1), found.get("data-v")))
            self.sequence.append(self.shown[-1][0])
        elif tag == "li" and found.get("id") == "fold":
            self.fold_hidden = "hidden" in found
        elif tag == "li" and "gap" in classes and "hidden" not in found:
            self.gaps.append("")
            self.sequence.append("gap")
            self._into = "gap"
        elif tag == "span" and found.get("id") in ("fold-text", "view-summary"):
            self._into = found["id"]
        elif tag == "tr" and "event" in classes:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "li" or (tag == "span" and self._into != "gap"):
            self._into = None
        elif tag == "td" and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.events.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._into == "gap":
            self.gaps[-1] += data
        elif self._into == "fold-text":
            self.fold = (self.fold or "") + data
        elif self._into == "view-summary":
            self.summary += data
        if self._cell is not None:
            self._cell.append(data)


class _Loads(HTMLParser):
    """Every reference in a page's markup and styles that a browser would fetch."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._style = tag == "style"
        if tag in ("link", "img", "iframe", "object", "embed", "base"):
            self.found.append(f"<{tag}>")
        for name, value in attrs:
            if name in ("src", "srcset", "poster", "action") or (
                name == "href" and not (value or "").startswith("#")
            ):
                self.found.append(f"{tag} {name}={value}")

    def handle_data(self, data: str) -> None:
        if self._style and ("url(" in data or "@import" in data):
            self.found.append("a style that fetches")

    def handle_endtag(self, tag: str) -> None:
        self._style = False


def _external(text: str) -> list[str]:
    loads = _Loads()
    loads.feed(text)
    return loads.found


def _dom(text: str) -> _Dom:
    dom = _Dom()
    dom.feed(text)
    return dom


@pytest.mark.parametrize("name", CLINE_TASKS)
def test_the_page_shows_each_turn_as_the_model_received_it(
    browser: str, daemon: DaemonProcess, tmp_path: Path, name: str
) -> None:
    """Chromium shows the events and, per turn, the kept messages and one line per dropped range."""
    source = conversation_file(name, tmp_path)
    window = "200000" if name == REAL_TASK else "64000"
    page = tmp_path / "report.html"
    code, out, err = run(
        "--endpoint", daemon.endpoint, "replay", str(source), "--model-window", window,
        "--json", "--html", str(page),
    )  # fmt: skip
    assert 0 == code, err
    report: dict[str, Any] = json.loads(out)
    text = page.read_text(encoding="utf-8")
    assert len(text.encode()) < 4_000_000, "a 1.5 MB conversation makes a page of a few MB"
    assert [] == _external(text), "the page loads nothing"
    history = load_history(source)
    profile = tmp_path / "profile"

    # The last turn, selected by default.
    dom = _dom(_browse(browser, profile, page.as_uri(), "--dump-dom"))
    expected_events = [(str(e["turn"]), e["kind"]) for e in report["events"]]
    expected_events += [(str(turn), "over window") for turn in report["over_window"]]
    assert sorted(expected_events) == sorted((row[0], row[1]) for row in dom.events)
    last = report["final_range"][1]
    dropped = sum(chars_of(history[index].get("content")) for index in range(2, last + 1))
    assert not dom.fold_hidden
    assert dom.fold is not None
    assert dom.fold.startswith(f"messages 2-{last} dropped, {dropped:,} characters")
    assert [0, 1, *range(last + 1, len(history))] == [index for index, _ in dom.shown]
    assert dom.summary.startswith(f"{len(history) - last + 1} of {len(history)} messages sent")

    # An earlier turn, picked by the page's own script from the address.
    first_cut = next(e for e in report["events"] if e["kind"] == "truncation")
    before = report["per_turn"][first_cut["turn"] - 2]
    dom = _dom(_browse(browser, profile, f"{page.as_uri()}#turn={before['turn']}", "--dump-dom"))
    assert dom.fold_hidden
    assert list(range(before["messages"])) == [index for index, _ in dom.shown]
    repaired = {int(index) for index, variant in dom.shown if variant is not None}
    assert repaired, "the task's tool calls without results are shown repaired"

    # What a person sees: not a blank page.
    picture = tmp_path / "report.png"
    _browse(browser, profile, page.as_uri(), "--window-size=1000,800", f"--screenshot={picture}")
    width, height, rows = read_png(picture.read_bytes())
    assert (1000, 800) == (width, height)
    step = len(rows[0]) // width
    pixels = [row[x : x + 3] for row in rows[::4] for x in range(0, len(row), step * 4)]
    background = max(set(pixels), key=pixels.count)
    assert sum(pixel != background for pixel in pixels) > len(pixels) // 10
    assert len(set(pixels)) > 50, "text, cards and the chart in many colours"
    blue = [p for p in pixels if p[2] > 180 and p[0] < 120 and p[1] < 160]
    assert len(blue) > 20, "the estimate's blue line is drawn"


def test_the_page_shows_the_turns_auto_dropped_from_the_middle(
    browser: str, daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Chromium shows each turn's view of an ``auto`` task without the runs of its deleted
    set, each folded into a line of its own where it stood, and the inspect page the same."""
    messages = render("cline", 40)
    source = tmp_path / "api_conversation_history.json"
    source.write_text(json.dumps(messages))
    page = tmp_path / "auto.html"
    base = ("--endpoint", daemon.endpoint)
    code, out, err = run(
        *base, "replay", str(source), "--model-window", "12000", "--strategy", "auto",
        "--pricing", "anthropic", "--json", "--html", str(page), "--keep", "--task", "page-auto",
    )  # fmt: skip
    assert 0 == code, err
    report: dict[str, Any] = json.loads(out)
    views, turns = report["views"], report["per_turn"]
    gapped = [turn for turn in turns if views[turn["view"]].get("dropped")]
    assert gapped, "auto left turns out of the middle of the views"
    cuts = [event for event in report["events"] if event["kind"] == "truncation"]
    assert any(event["dropped"] for event in cuts)
    profile = tmp_path / "profile"
    chars = [chars_of(message.get("content")) for message in messages]

    def check(turn: dict[str, Any], dom: _Dom) -> None:
        view, end = views[turn["view"]], turn["messages"]
        deleted = view["deleted_range"]
        dropped = [
            index for first, last in view.get("dropped", []) for index in range(first, last + 1)
        ]
        hidden = set(range(2, deleted[1] + 1) if deleted else ()) | set(dropped)
        assert [index for index in range(end) if index not in hidden] == [i for i, _ in dom.shown]
        assert turn["sent"] == len(dom.shown)
        lines = [
            f"messages {first}-{last} dropped, {sum(chars[first : last + 1]):,} characters"
            if first < last
            else f"messages {first} dropped, {chars[first]:,} characters"
            for first, last in view.get("dropped", [])
        ]
        assert len(lines) == len(dom.gaps)
        for line, shown in zip(lines, dom.gaps, strict=True):
            assert shown.startswith(line)
        assert dom.summary.startswith(f"{turn['sent']} of {end} messages sent")

    # The last turn, as the page loads; earlier ones, picked by the page's script.
    check(turns[-1], _dom(_browse(browser, profile, page.as_uri(), "--dump-dom")))
    text = page.read_text(encoding="utf-8")
    assert "deleted set [" in text  # the events name the set, as ctxwin inspect does
    others = [gapped[0], turns[turns.index(gapped[0]) - 1]]
    others += [turn for turn in gapped if views[turn["view"]] != views[gapped[0]["view"]]][:1]
    for turn in others:
        check(
            turn,
            _dom(_browse(browser, profile, f"{page.as_uri()}#turn={turn['turn']}", "--dump-dom")),
        )
    assert not _dom(
        _browse(browser, profile, f"{page.as_uri()}#turn={others[1]['turn']}", "--dump-dom")
    ).gaps

    # The task now: inspect says the set as the page does, and the page folds its runs.
    code, out, err = run(*base, "inspect", "page-auto", "--messages", str(source))
    assert 0 == code, err
    with Client(daemon.endpoint) as client:
        inspected = client.inspect("page-auto")
    set_text = ", ".join(f"[{first}, {last}]" for first, last in inspected["dropped"])
    deleted = inspected["deleted_range"]
    hidden = (deleted[1] - 1 if deleted else 0) + sum(
        last - first + 1 for first, last in inspected["dropped"]
    )
    assert f", deleted set {set_text} ({hidden} messages hidden" in out
    inspected_page = tmp_path / "inspect.html"
    code, _, err = run(
        *base, "inspect", "page-auto", "--messages", str(source), "--html", str(inspected_page)
    )
    assert 0 == code, err
    dom = _dom(_browse(browser, profile, inspected_page.as_uri(), "--dump-dom"))
    assert len(dom.shown) == len(messages) - hidden
    assert len(dom.gaps) == len(inspected["dropped"])
    assert f"deleted set {set_text}" in inspected_page.read_text(encoding="utf-8")


def test_each_run_of_a_deleted_set_folds_into_a_line_where_it_stood(
    browser: str, tmp_path: Path
) -> None:
    """Two runs of a deleted set fold into two lines, each after its last message, and the
    page's script shows another turn's runs in their place."""
    history: list[dict[str, Any]] = [
        {
            "role": "user" if index % 2 == 0 else "assistant",
            "content": [{"type": "text", "text": f"message {index} " + "x" * index}],
        }
        for index in range(12)
    ]
    views = [ViewState(None, dropped=[[3, 5]]), ViewState([2, 2], dropped=[[4, 5], [8, 9]])]
    page = Page(
        title="gaps", facts=[], notes=[], cards=[], chart="", events=[],
        turns=[PageTurn(1, 10, 0, "one"), PageTurn(2, 12, 1, "two")], views=views,
        variants=[], history=history, counts=TokenCounts([3] * 12, []),
    )  # fmt: skip
    path = tmp_path / "gaps.html"
    write_page(path, render_page(page))
    profile = tmp_path / "profile"
    chars = [chars_of(message["content"]) for message in history]

    def line(first: int, last: int) -> str:
        return (
            f"messages {first}-{last} dropped, {sum(chars[first : last + 1]):,} characters "
            f"({3 * (last - first + 1)} tokens)"
        )

    dom = _dom(_browse(browser, profile, path.as_uri(), "--dump-dom"))
    assert dom.sequence == [0, 1, 3, "gap", 6, 7, "gap", 10, 11]
    assert dom.gaps == [line(4, 5), line(8, 9)]
    assert not dom.fold_hidden  # the range's own line, message 2
    assert dom.summary.startswith("7 of 12 messages sent, 21 tokens counted")
    dom = _dom(_browse(browser, profile, f"{path.as_uri()}#turn=1", "--dump-dom"))
    assert dom.sequence == [0, 1, 2, "gap", 6, 7, 8, 9]
    assert dom.gaps == [line(3, 5)]
    assert dom.fold_hidden
