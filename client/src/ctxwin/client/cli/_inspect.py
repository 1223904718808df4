"""``ctxwin inspect``: a task's overlay, range, summaries and what its overlay saves; with
``--messages``, the conversation as the model now receives it (``--html``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, TextIO

from ctxwin import proto

from .._sync import Client
from ._commands import (
    EXIT_DAEMON_ERROR,
    EXIT_OK,
    UsageError,
    print_json,
    read_conversation,
    read_history,
    shown_range,
    shown_set,
    table,
)
from ._dialects import message_chars
from .page import inspect_page, page_problem, write_page
from .replay import (
    NativeViews,
    Overlay,
    Sources,
    Variant,
    ViewState,
    message_tokens,
    original_text,
    parse_sources,
    parse_updates,
    view_state,
)


def inspect(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """``ctxwin inspect``: the task's state; with ``--messages``, what its overlay saves and
    what its range hides; with ``--html``, the page of its view."""
    if args.html is not None:
        problem = page_problem(args.html) if args.messages else "--html needs --messages FILE"
        if problem is not None:
            raise UsageError(problem)
    history, dialect = _inspect_history(args, err)
    result: Any = client.inspect(args.task)
    if result.get("exists") is False:
        err.write(f"ctxwin: task {args.task} does not exist (nothing stored, not loaded)\n")
        return EXIT_DAEMON_ERROR
    if history is not None:
        # The view these messages would now get, worked out by the daemon on a copy of the
        # task: inspecting changes nothing of what it looks at.
        result = client.inspect(args.task, messages=history, dialect=dialect)
        if result.get("restarted"):
            err.write(
                f"ctxwin: {args.messages} is not the history task {args.task}'s range and "
                "edits were made on: its next request starts the task over (shown so)\n"
            )
    view_range = None if result.get("restarted") else result["deleted_range"]
    overlay = parse_updates(result["updates"])
    native = history is not None and dialect != proto.CLINE
    sources = parse_sources(result.get("sources", [])) if native else None
    dropped = [] if result.get("restarted") else result.get("dropped", [])
    rows = _overlay_rows(overlay, sources, history, result["deleted_range"], dropped)
    variants: list[Variant] = []
    state: ViewState | None = None
    if history is not None:
        view = result["view"]
        shown = {} if result.get("restarted") else overlay
        if sources is not None:
            origins = result.get("origins") or [None] * len(view)
            state = NativeViews(history, variants).state(
                view, origins, len(history), view_range, shown, sources
            )
        else:
            state = view_state(history, view, view_range, shown, variants, result.get("origins"))
    hidden, hidden_chars = _hidden(result, history, state, dialect)
    saved_values = [row["saved"] for row in rows if row["saved"] is not None]
    summary = {
        "task": args.task,
        "deleted_range": result["deleted_range"],
        "dropped": result.get("dropped", []),
        "hidden_messages": hidden,
        "hidden_chars": hidden_chars,
        "overlay_chars_saved": sum(saved_values) if history is not None else None,
        "dirty": result["dirty"],
    }
    if args.html is not None and history is not None and state is not None:
        counts = message_tokens(client, history, variants, dialect)
        page = inspect_page(
            args.task, history, state, variants, counts, rows, dialect, result.get("dropped", [])
        )
        try:
            write_page(args.html, page)
        except OSError as exc:
            raise UsageError(f"--html: cannot write {args.html}: {exc}") from None
        if not args.json:
            out.write(f"page written to {args.html}\n")
    if args.json:
        # "summary" stays the daemon's (the summary the view carries, if any); the view
        # itself is the file's messages again, left out.
        shown = {key: value for key, value in result.items() if key not in ("view", "origins")}
        print_json({**shown, "overview": summary, "blocks": rows}, out)
    else:
        _write_text(result, summary, rows, out)
    return EXIT_OK


def _overlay_rows(
    overlay: Overlay,
    sources: Sources | None,
    history: list[dict[str, Any]] | None,
    deleted_range: Any = None,
    dropped: Any = (),
) -> list[dict[str, Any]]:
    """One row per block the overlay edits: what the edit did (shortened, stubbed, a
    replaced read, a notice), its updates, size now, whether the range or the deleted set
    hides its message, and (with the history) the characters it saves: from ``inspect``'s
    sources in another dialect; none for a hidden message, whose characters the range or
    the deleted set saves."""
    rows: list[dict[str, Any]] = []
    end = deleted_range[1] if deleted_range else 1
    for (index, block), (edit_type, texts) in sorted(overlay.items()):
        row: dict[str, Any] = {
            "message": index,
            "block": block,
            "edit": proto.edit_label(edit_type, texts[-1] if texts else None),
            "updates": len(texts),
            "chars": len(texts[-1]) if texts else 0,
            "saved": None,
            "hidden": 2 <= index <= end or any(a <= index <= b for a, b in dropped),
        }
        if row["hidden"]:
            pass  # not sent: the range saves all of it (hidden_chars)
        elif sources is not None:
            source = sources.get((index, block))
            if texts and source is not None:
                row["saved"] = len(source[1]) - len(texts[-1])
        elif history is not None and texts:
            original = original_text(history, index, block)
            if original is not None:
                row["saved"] = len(original) - len(texts[-1])
        rows.append(row)
    return rows


def _hidden(
    result: Mapping[str, Any],
    history: list[dict[str, Any]] | None,
    state: ViewState | None,
    dialect: str,
) -> tuple[int, int | None]:
    """The messages the view hides, and their characters when the history is given: the
    ones another dialect's view neither sends nor rebuilds, else the range's and the
    deleted set's."""
    if history is not None and state is not None and state.order is not None:
        removed = state.removed(len(history))
        return len(removed), sum(message_chars(history[i], dialect) for i in removed)
    if history is not None and state is not None and not result.get("restarted"):
        removed = [i for i in range(len(history)) if not state.sent(i, len(history))]
        return len(removed), sum(message_chars(history[i]) for i in removed)
    # The task's range and deleted set (of a history they were not made on, or not given):
    # messages 2..end and the set's, within the history when its length is known (a range
    # may run past the end, or before its start, and then hides what exists of it).
    deleted_range = result["deleted_range"]
    end = deleted_range[1] if deleted_range else 1
    length = len(history) if history is not None else result.get("history")
    if isinstance(length, int):
        end = min(end, length - 1)
    removed = list(range(2, end + 1))
    for first, last in result.get("dropped", []):
        if isinstance(length, int):
            last = min(last, length - 1)
        removed += range(max(first, end + 1), last + 1)
    if history is None:
        return len(removed), None
    return len(removed), sum(message_chars(history[i]) for i in removed)


def _write_text(
    result: Mapping[str, Any], summary: Mapping[str, Any], rows: list[dict[str, Any]], out: TextIO
) -> None:
    hidden_chars = summary["hidden_chars"]
    dropped = summary["dropped"]
    out.write(
        f"task {summary['task']}: range {shown_range(summary['deleted_range'])}"
        + (f", deleted set {shown_set(dropped)}" if dropped else "")
        + f" ({summary['hidden_messages']} messages hidden"
        + (f", {hidden_chars:,} chars" if hidden_chars is not None else "")
        + f"), {'unsaved changes' if result['dirty'] else 'saved'}\n"
    )
    if "store" in result:
        fence = result.get("fence")
        out.write(
            f"store {result['store']}, owner {result.get('owner') or '-'}"
            + (f", fence {fence}" if fence is not None else "")
            + "\n"
        )
    calibration = result.get("calibration")
    if calibration is not None:
        held = result.get("history")
        out.write(
            f"calibration {calibration['ratio']:.3f} reported/estimated tokens "
            f"({int(calibration['samples'])} reports); "
            + (
                f"{held} messages kept for delta sync\n"
                if held is not None
                else "no kept history\n"
            )
        )
    _write_summaries(result, out)
    if not rows:
        out.write("overlay: empty\n")
        return
    out.write(f"overlay: {len({row['message'] for row in rows})} messages, {len(rows)} blocks\n")
    table(
        [
            (
                row["message"],
                row["block"],
                row["edit"],
                row["updates"],
                f"{row['chars']:,}",
                "hidden" if row["hidden"] else "-" if row["saved"] is None else f"{row['saved']:,}",
            )
            for row in rows
        ],
        ("message", "block", "edit", "updates", "chars now", "chars saved"),
        out,
    )
    if any(row["hidden"] for row in rows):
        out.write(
            "(hidden: the range or the deleted set hides that message; its characters count "
            "as hidden)\n"
        )
    if summary["overlay_chars_saved"] is not None:
        out.write(f"overlay saves {summary['overlay_chars_saved']:,} chars\n")
    else:
        out.write("(give --messages FILE to compute what the overlay saves)\n")


def _write_summaries(result: Mapping[str, Any], out: TextIO) -> None:
    """The summary the task's view carries, and how many are stored (docs/SUMMARIES.md)."""
    stored = result.get("summaries") or []
    if not stored:
        return
    shown = result.get("summary")
    if shown is None:
        out.write(f"summaries: {len(stored)} stored, none in the view (the range is below)\n")
        return
    out.write(
        f"summary ({shown['kind']}, {len(stored)} stored): stands for messages "
        f"{shown_range(shown['range'])}, {shown['chars']:,} chars, stored at ts {shown['ts']}\n"
    )
    for line in str(shown["text"]).splitlines()[:_SUMMARY_LINES]:
        out.write(f"  {line[:160]}\n")


_SUMMARY_LINES = 12


def _inspect_history(
    args: argparse.Namespace, err: TextIO
) -> tuple[list[dict[str, Any]] | None, str]:
    """``inspect --messages``: the history and its dialect (``--dialect``, else its shape)."""
    if not args.messages:
        return None, proto.CLINE
    history, detected = read_conversation(args.messages, err)
    dialect = args.dialect or detected
    if dialect == proto.CLINE:
        return read_history(args.messages), dialect  # SPEC.md's messages, checked as such
    return history, dialect
