"""Price sheets: what a provider bills for input tokens written to and read from its cache.

A sheet holds multipliers of the model's base input price: ``input`` for
tokens sent without caching, ``cache_write`` for tokens the provider caches
as it reads them (every token after the cached prefix, under automatic
caching), ``cache_read`` for tokens served from the cache. The sources of
each figure are listed in docs/PRICING.md. Output tokens are the same
whatever the context strategy, and are left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._codec import WireRecord

__all__ = [
    "PRICE_SHEETS",
    "PriceSheet",
    "pricing_error",
    "sheet_for_model",
    "sheet_from_wire",
]


@dataclass(frozen=True, slots=True)
class PriceSheet(WireRecord):
    """Multipliers of the base input price for sent, written and cached input tokens."""

    name: str
    input: float
    cache_write: float
    cache_read: float

    def cost(self, written: float, cached: float) -> float:
        """The cost, in base input tokens, of a request with these written and cached tokens."""
        return written * self.cache_write + cached * self.cache_read


def _sheet(name: str, cache_write: float, cache_read: float) -> PriceSheet:
    return PriceSheet(name, 1.0, cache_write, cache_read)


PRICE_SHEETS: dict[str, PriceSheet] = {
    sheet.name: sheet
    for sheet in (
        # Anthropic: 5-minute cache writes 1.25x, 1-hour writes 2x, reads 0.1x.
        _sheet("anthropic", 1.25, 0.1),
        _sheet("anthropic-1h", 2.0, 0.1),
        # OpenAI: automatic caching, no write premium; the cached-input discount
        # depends on the model family (GPT-5 0.1x, GPT-4.1 and o3/o4 0.25x, GPT-4o and o1 0.5x).
        _sheet("openai", 1.0, 0.1),
        _sheet("openai-gpt-4.1", 1.0, 0.25),
        _sheet("openai-gpt-4o", 1.0, 0.5),
        # Gemini: implicit caching, written at the standard input price; 2.5 and later
        # read at 0.1x, 2.0 at 0.25x.
        _sheet("gemini", 1.0, 0.1),
        _sheet("gemini-2.0", 1.0, 0.25),
        # DeepSeek: disk cache on by default; a hit costs $0.07 against $0.27 a miss.
        _sheet("deepseek", 1.0, 0.07 / 0.27),
        # Tokens only: every input token counts 1.
        _sheet("none", 1.0, 1.0),
    )
}
"""The named sheets (docs/PRICING.md cites each figure)."""

_FAMILIES: tuple[tuple[str, str], ...] = (
    ("claude", "anthropic"),
    ("anthropic", "anthropic"),
    ("gpt-4.1", "openai-gpt-4.1"),
    ("gpt-4o", "openai-gpt-4o"),
    ("o1", "openai-gpt-4o"),
    ("o3", "openai-gpt-4.1"),
    ("o4", "openai-gpt-4.1"),
    ("gpt-5", "openai"),
    ("gpt", "openai"),
    ("gemini-2.0", "gemini-2.0"),
    ("gemini", "gemini"),
    ("deepseek", "deepseek"),
)
"""Model id prefixes (after any ``vendor/`` part) and the sheet they take, first match wins."""

_PROVIDERS = {
    "anthropic": "anthropic",
    "openai": "openai",
    "gemini": "gemini",
    "google": "gemini",
    "deepseek": "deepseek",
}


def sheet_for_model(model: Mapping[str, Any]) -> PriceSheet | None:
    """The sheet a model's id (or else its provider) implies, or None when unknown."""
    model_id = model.get("id")
    if isinstance(model_id, str):
        name = model_id.lower().rsplit("/", 1)[-1]
        for prefix, sheet in _FAMILIES:
            if name.startswith(prefix):
                return PRICE_SHEETS[sheet]
    provider = model.get("provider")
    if isinstance(provider, str) and provider.lower() in _PROVIDERS:
        return PRICE_SHEETS[_PROVIDERS[provider.lower()]]
    return None


_MULTIPLIERS = ("input", "cache_write", "cache_read")


def pricing_error(value: object) -> str | None:
    """What is wrong with a ``pricing`` argument, or None when it is a sheet name or multipliers."""
    if isinstance(value, str):
        if value in PRICE_SHEETS:
            return None
        return "must name a price sheet (" + ", ".join(PRICE_SHEETS) + ") or give multipliers"
    if not isinstance(value, Mapping):
        return "must be a sheet name or a map of input, cache_write and cache_read"
    unknown = sorted(str(key) for key in value if key not in _MULTIPLIERS)
    if unknown:
        return f"has unknown keys {unknown} (only input, cache_write, cache_read)"
    for key in _MULTIPLIERS:
        number = value.get(key)
        if isinstance(number, bool) or not isinstance(number, int | float):
            return f"needs a number {key!r}"
        if not 0 <= number <= 1000 or number != number:
            return f"{key} must be between 0 and 1000"
    return None


def sheet_from_wire(value: object) -> PriceSheet:
    """The sheet a checked ``pricing`` argument (or a stored sheet) names or gives.

    Raises:
        ValueError: ``value`` is neither (see :func:`pricing_error`).
    """
    problem = pricing_error(value)
    if problem is not None:
        if isinstance(value, Mapping) and "name" in value:
            # A stored sheet: its name beside the multipliers.
            stripped = {key: item for key, item in value.items() if key != "name"}
            if pricing_error(stripped) is None:
                return sheet_from_wire(stripped)
        raise ValueError(f"pricing {problem}")
    if isinstance(value, str):
        return PRICE_SHEETS[value]
    assert isinstance(value, Mapping)
    multipliers = [float(value[key]) for key in _MULTIPLIERS]
    for sheet in PRICE_SHEETS.values():
        if [sheet.input, sheet.cache_write, sheet.cache_read] == multipliers:
            return sheet
    return PriceSheet("custom", *multipliers)
