"""Load the conformance scenarios of tests/conformance and compare their results."""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCENARIO_DIR = Path(__file__).resolve().parent / "conformance" / "scenarios"
"""The scenarios, one gzipped JSON file each (tests/conformance/README.md)."""
SCENARIO_COUNT = 150
"""How many there are: a copy that lost some cannot pass silently."""
PLACEHOLDER_NOTICES = {
    "truncation": "@@TRUNCATION_NOTICE@@",
    "duplicate_file_read": "@@DUPLICATE_FILE_READ_NOTICE@@",
    "first_user": "@@FIRST_USER_NOTICE@@",
    "missing_result": "@@MISSING_RESULT@@",
}
"""Notice texts the scenarios were recorded with, by engine field name."""

PLACEHOLDER_ENV = {
    "CTXWIN_TRUNCATION_NOTICE": PLACEHOLDER_NOTICES["truncation"],
    "CTXWIN_DUPLICATE_FILE_READ_NOTICE": PLACEHOLDER_NOTICES["duplicate_file_read"],
    "CTXWIN_FIRST_USER_NOTICE": PLACEHOLDER_NOTICES["first_user"],
    "CTXWIN_MISSING_RESULT": PLACEHOLDER_NOTICES["missing_result"],
}
"""The daemon's environment for the same notice texts."""


@dataclass(frozen=True)
class Scenario:
    """One task's life: requests in order, with the results SPEC.md requires."""

    name: str
    task: str
    initial_updates: list[Any] | None
    conversation: list[dict[str, Any]]
    steps: list[dict[str, Any]]


def load_scenarios() -> list[Scenario]:
    """Every scenario file, sorted by name; fails loudly when the folder is missing or short."""
    if not SCENARIO_DIR.is_dir():
        raise FileNotFoundError(f"conformance scenarios not found at {SCENARIO_DIR}")
    scenarios = []
    for path in sorted(SCENARIO_DIR.glob("*.json.gz")):
        data = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
        scenarios.append(
            Scenario(
                data["name"],
                data["task"],
                data["initial_updates"],
                data["conversation"],
                data["steps"],
            )
        )
    if len(scenarios) != SCENARIO_COUNT:
        raise FileNotFoundError(
            f"{len(scenarios)} scenario files in {SCENARIO_DIR}, not {SCENARIO_COUNT}"
        )
    return scenarios


def expand_args(value: Any, conversation: list[dict[str, Any]]) -> Any:
    """Replace each ``{"$conversation": n}`` with ``conversation[:n]``."""
    if isinstance(value, dict):
        if set(value) == {"$conversation"}:
            return conversation[: value["$conversation"]]
        return {key: expand_args(item, conversation) for key, item in value.items()}
    if isinstance(value, list):
        return [expand_args(item, conversation) for item in value]
    return value


def digest(message: Any) -> str:
    """First 16 hex characters of the SHA-256 of the message's canonical JSON."""
    canonical = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def expected_value(expected: Any, actual: Any) -> tuple[Any, Any]:
    """Both sides in comparable form: message lists as digests when the file has digests."""
    if isinstance(expected, dict) and set(expected) == {"$digests"}:
        return expected["$digests"], [digest(message) for message in actual or []]
    return expected, actual


def messages_match(expected: Any, actual: Any) -> bool:
    """Whether an expected message list (or its digests) equals ``actual``."""
    left, right = expected_value(expected, actual)
    return bool(left == right)


def normalise_updates(updates: list[Any]) -> list[Any]:
    """An overlay in on-disk form, messages and blocks sorted by index (updates keep order)."""
    return sorted(
        (
            [index, [edit_type, sorted(blocks, key=lambda block: block[0])]]
            for index, (edit_type, blocks) in updates
        ),
        key=lambda item: item[0],
    )
