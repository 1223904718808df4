"""Prefix digests for delta sync."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest

from ctxwin.proto import EMPTY_DIGEST, DigestChain, chain_digest, message_digest

MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "task"},
    {"role": "assistant", "content": [{"type": "text", "text": "ok 😀"}]},
    {"role": "user", "content": "more", "ts": 3},
]


def test_digests_follow_the_documented_formula() -> None:
    """D[n] = blake2b16(D[n-1] || blake2b16(msgpack(message n))), D[0] = 16 zero bytes."""
    chain = DigestChain(MESSAGES)
    expected = bytes(16)
    for length, message in enumerate(MESSAGES, start=1):
        packed = msgpack.packb(message, use_bin_type=True)
        inner = hashlib.blake2b(packed, digest_size=16).digest()
        expected = hashlib.blake2b(expected + inner, digest_size=16).digest()
        assert expected == chain.digest(length)
    assert EMPTY_DIGEST == chain.digest(0)
    assert chain_digest(chain.digest(2), message_digest(MESSAGES[2])) == chain.digest(3)


def test_truncate_and_extend_give_the_same_chain_as_building_afresh() -> None:
    """Cutting back and appending other messages equals a chain built from the result."""
    chain = DigestChain(MESSAGES)
    chain.truncate(1)
    replacement = [{"role": "assistant", "content": "other"}]
    chain.extend(replacement)
    fresh = DigestChain([MESSAGES[0], *replacement])
    assert (2, fresh.digest(2)) == (len(chain), chain.digest(2))
    assert chain.digest(2) != DigestChain(MESSAGES).digest(2)


def test_matches_refuses_prefixes_it_does_not_cover() -> None:
    """A length past the end or negative never matches, whatever the digest."""
    chain = DigestChain(MESSAGES)
    assert chain.matches(3, chain.digest(3))
    assert not chain.matches(4, chain.digest(3))
    assert not chain.matches(-1, EMPTY_DIGEST)
    assert not chain.matches(2, "not bytes")
    with pytest.raises(IndexError):
        chain.digest(4)


def test_any_change_in_an_earlier_message_changes_every_later_digest() -> None:
    """Digests are chained: editing message 0 changes D[1..n]."""
    edited = [{"role": "user", "content": "task!"}, *MESSAGES[1:]]
    original, changed = DigestChain(MESSAGES), DigestChain(edited)
    assert all(original.digest(n) != changed.digest(n) for n in range(1, 4))
