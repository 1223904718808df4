"""The texts the engine writes into the conversation (SPEC.md §5)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Notices:
    """Notice texts; configuration, with defaults written by this project.

    Attributes:
        truncation: replaces the first assistant message once turns were removed.
        duplicate_file_read: stands in for a file's content that a later read supersedes.
        first_user: replaces the first user message's first text block after a compaction.
        missing_result: the content of a tool result that the view had to invent.
        result_as_text: the content of a tool result the view had to invent for a call
            whose result the next user message gives as text (Cline's
            ``[tool for 'x'] Result:``).
    """

    truncation: str = (
        "[ctxwin] Earlier turns of this conversation were removed to keep it within the "
        "model's context window. Give the most weight to the latest messages when "
        "deciding what to do next."
    )
    duplicate_file_read: str = (
        "[ctxwin] This copy of the file's content was removed to save context; a later read "
        "of the same file in this conversation holds a newer copy."
    )
    first_user: str = "[ctxwin] Please continue helping the user with the task."
    missing_result: str = "[ctxwin] The result of this tool call is missing from the conversation."
    result_as_text: str = "[ctxwin] The result of this tool call follows as text in this message."


DEFAULT_NOTICES = Notices()
"""The notices used when no configuration says otherwise."""
