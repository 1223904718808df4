"""Context windows of well-known models, for adapters given no ``context_window``.

The figures are the input windows the providers publish for each model family.
A model id matches the longest prefix here (``gpt-4o-mini-2024-07-18`` ->
``gpt-4o``); an id that matches none gets None, and the daemon then uses its
default window (SPEC.md §2). Pass ``context_window=`` to an adapter to override.
"""

from __future__ import annotations

__all__ = ["KNOWN_CONTEXT_WINDOWS", "known_context_window"]

KNOWN_CONTEXT_WINDOWS: dict[str, int] = {
    # OpenAI
    "gpt-3.5-turbo": 16_385,
    "gpt-4": 8_192,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.5": 128_000,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    # Anthropic
    "claude-": 200_000,
    "claude-2.0": 100_000,
    # Google
    "gemini-1.5-pro": 2_097_152,
    "gemini-1.5-flash": 1_048_576,
    "gemini-2": 1_048_576,
    "gemini-3": 1_048_576,
    # DeepSeek
    "deepseek-": 128_000,
}


def known_context_window(model: str) -> int | None:
    """The published window of ``model`` (longest matching prefix), or None when unknown.

    Args:
        model: a model id as given to the SDK (a provider prefix such as
            ``openai:`` or ``anthropic/`` is ignored).

    Returns:
        The window in tokens, or None.
    """
    name = model.lower().rsplit("/", 1)[-1]
    provider, colon, rest = name.partition(":")
    if colon and (provider == "ft" or provider.isalpha() or "-" in provider):
        name = rest  # "openai:gpt-4o", "google-gla:gemini-2.5-pro", "ft:gpt-4o-mini:org::id"
    best: str | None = None
    for prefix in KNOWN_CONTEXT_WINDOWS:
        if name.startswith(prefix) and (best is None or len(prefix) > len(best)):
            best = prefix
    return KNOWN_CONTEXT_WINDOWS[best] if best is not None else None
