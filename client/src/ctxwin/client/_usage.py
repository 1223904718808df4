"""Build the wire ``usage`` map from the token counts a model provider reports.

The agent passes the previous request's usage to ``prepare_request`` and
``should_compact`` each turn (SPEC.md §2, §7). Providers report it in their own
shapes; these helpers accept the provider's usage object or map as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxwin.proto import USAGE_FIELDS, Usage


def _field(source: Any, *path: str) -> int:
    """A non-negative integer at ``path`` in a map or an SDK object; 0 when absent."""
    value = source
    for name in path:
        if value is None:
            return 0
        value = value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(0, int(value))


def _usage(ts: int | None, tokens_in: int, tokens_out: int, writes: int, reads: int) -> Usage:
    usage = Usage(
        tokens_in=tokens_in, tokens_out=tokens_out, cache_writes=writes, cache_reads=reads
    )
    if ts is not None:
        usage["ts"] = ts
    return usage


def usage_from_anthropic(usage: Any, *, ts: int | None = None) -> Usage:
    """Usage from an Anthropic-style report.

    Args:
        usage: a map or object with ``input_tokens``, ``output_tokens``,
            ``cache_creation_input_tokens`` and ``cache_read_input_tokens``
            (missing ones count 0). Anthropic's ``input_tokens`` already
            excludes the cached part.
        ts: when the request was made (ms since the epoch), if known.

    Returns:
        The wire ``usage`` map.
    """
    return _usage(
        ts,
        _field(usage, "input_tokens"),
        _field(usage, "output_tokens"),
        _field(usage, "cache_creation_input_tokens"),
        _field(usage, "cache_read_input_tokens"),
    )


def usage_from_openai(usage: Any, *, ts: int | None = None) -> Usage:
    """Usage from an OpenAI-style report.

    Args:
        usage: a map or object with ``prompt_tokens``, ``completion_tokens``
            and ``prompt_tokens_details.cached_tokens``. OpenAI's prompt count
            includes the cached tokens, so they are moved out of ``tokens_in``
            into ``cache_reads``; the total stays prompt + completion.
        ts: when the request was made (ms since the epoch), if known.

    Returns:
        The wire ``usage`` map.
    """
    prompt = _field(usage, "prompt_tokens")
    cached = min(prompt, _field(usage, "prompt_tokens_details", "cached_tokens"))
    return _usage(ts, prompt - cached, _field(usage, "completion_tokens"), 0, cached)


def usage_from_metrics(tokens: Any, *, ts: int | None = None) -> Usage:
    """Usage from the ``metrics.tokens`` map Cline stores on assistant messages.

    Args:
        tokens: ``{prompt, completion, cached}``; ``prompt`` is taken to
            include ``cached``, as with OpenAI-compatible providers.
        ts: when the request was made (ms since the epoch), if known.

    Returns:
        The wire ``usage`` map.
    """
    prompt = _field(tokens, "prompt")
    cached = min(prompt, _field(tokens, "cached"))
    return _usage(ts, prompt - cached, _field(tokens, "completion"), 0, cached)


def usage_from_provider(usage: Any, *, ts: int | None = None) -> Usage:
    """Usage from whichever of the known shapes ``usage`` has.

    Args:
        usage: an Anthropic-style, OpenAI-style or Cline ``metrics.tokens`` report.
        ts: when the request was made (ms since the epoch), if known.

    Returns:
        The wire ``usage`` map (all zero for an unknown shape).
    """

    def has(name: str) -> bool:
        if isinstance(usage, Mapping):
            return name in usage
        return getattr(usage, name, None) is not None

    if has("prompt_tokens") or has("completion_tokens"):
        return usage_from_openai(usage, ts=ts)
    if has("prompt") or has("completion"):
        return usage_from_metrics(usage, ts=ts)
    return usage_from_anthropic(usage, ts=ts)


def total_tokens(usage: Usage) -> int:
    """``tokens_in + tokens_out + cache_writes + cache_reads`` (SPEC.md §2)."""
    return sum(_field(usage, name) for name in USAGE_FIELDS)
