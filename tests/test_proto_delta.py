"""Prefix digests for delta sync."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest

from ctxwin import proto
from ctxwin.proto import EMPTY_DIGEST, DeltaSender, DigestChain, chain_digest, message_digest

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


def test_the_first_call_sends_the_whole_list_then_only_what_was_added() -> None:
    """DeltaSender sends messages once, then base, base_digest and the new messages."""
    sender = DeltaSender()
    history = list(MESSAGES[:2])
    first = sender.args_for(history)
    assert {"messages": history} == first
    sender.sent(history, first)
    history.append(MESSAGES[2])
    second = sender.args_for(history)
    assert {"base": 2, "base_digest": DigestChain(MESSAGES).digest(2), "append": [MESSAGES[2]]} == (
        second
    )
    sender.sent(history, second)
    assert {"base": 3, "base_digest": DigestChain(MESSAGES).digest(3), "append": []} == (
        sender.args_for(history)
    )


def test_an_edited_newest_message_is_sent_again() -> None:
    """The tail of the last sync is hashed again, so an in-place edit there is noticed."""
    sender = DeltaSender()
    history = [dict(message) for message in MESSAGES]
    sender.sent(history, sender.args_for(history))
    history[2]["content"] = "edited in place"
    args = sender.args_for(history)
    assert (2, [history[2]]) == (args["base"], args["append"])


def test_a_shorter_history_sends_a_shorter_base() -> None:
    """Dropped trailing messages (a resumed task) cut the base back."""
    sender = DeltaSender()
    sender.sent(MESSAGES, sender.args_for(MESSAGES))
    args = sender.args_for(MESSAGES[:1])
    assert (1, []) == (args["base"], args["append"])
    sender.reset()
    assert {"messages": MESSAGES[:1]} == sender.args_for(MESSAGES[:1])


def test_a_patch_receiver_keeps_overrides_between_patches() -> None:
    """reuse keeps the held overrides, drops the listed ones and takes the new ones."""
    history = [{"role": "user", "content": str(index)} for index in range(6)]
    first = {"length": 6, "keep_from": 2, "overrides": [[3, {"x": 3}], [4, {"x": 4}]]}
    receiver = proto.PatchReceiver()
    view = receiver.apply(history, {**first, "token": b"t1"})
    assert [{"x": 3}, {"x": 4}] == view[3:5]
    second = {
        "length": 6,
        "keep_from": 2,
        "overrides": [[5, {"x": 5}]],
        "reuse": True,
        "base": b"t1",
        "dropped": [4],
        "token": b"t2",
    }
    view = receiver.apply(history, second)
    assert [{"x": 3}, history[4], {"x": 5}] == view[3:]
    assert b"t2" == receiver.token
    receiver.reset()
    with pytest.raises(ValueError, match="does not hold"):
        receiver.apply(history, second)


def test_a_patch_receiver_gives_each_view_message_its_origin_across_reused_patches() -> None:
    """A list override stands for its index by its last message unless the patch's
    ``origins`` say otherwise; held origins stand while their override is reused, and go
    with it when it is dropped or sent again."""
    history = [{"role": "user", "content": str(index)} for index in range(6)]
    receiver = proto.PatchReceiver()
    assert receiver.origins() is None
    first = {
        "length": 6,
        "keep_from": 0,
        "order": [[0, 2], [4, 6]],
        "overrides": [[1, ["added", "one"]], [4, [history[4], "added", "rebuilt 3"]]],
        "origins": [[4, [4, None, 3]]],
        "token": b"1",
    }
    view = receiver.apply(history, first)
    assert [history[0], "added", "one", history[4], "added", "rebuilt 3", history[5]] == view
    assert [0, None, 1, 4, None, 3, 5] == receiver.origins()
    reused = {
        "length": 6,
        "keep_from": 0,
        "order": [[0, 2], [4, 6]],
        "overrides": [[5, "five"]],
        "reuse": True,
        "base": b"1",
        "dropped": [1],
        "token": b"2",
    }
    receiver.apply(history, reused)
    assert [0, 1, 4, None, 3, 5] == receiver.origins()
    again = {**reused, "overrides": [[4, ["added", "four"]]], "dropped": [], "token": b"3"}
    receiver.apply(history, {**again, "base": b"2"})
    assert [0, 1, None, 4, 5] == receiver.origins()
    with pytest.raises(ValueError, match="origins must be"):
        receiver.apply(history, {**first, "origins": [[4, ["x"]]]})
    receiver.apply(history, {**first, "origins": [[4, [4, None]]]})
    with pytest.raises(ValueError, match="do not match"):
        receiver.origins()
    receiver.took_whole()
    assert receiver.origins() is None


def test_reuse_applies_against_the_patch_it_names_in_any_order() -> None:
    """Replies to concurrent calls may be read out of order: each reuses its own base."""
    history = [{"role": "user", "content": str(index)} for index in range(6)]
    receiver = proto.PatchReceiver()
    receiver.apply(history, {"length": 6, "keep_from": 2, "overrides": [[3, "a"]], "token": b"1"})
    later = {"length": 6, "keep_from": 2, "overrides": [[4, "c"]], "token": b"3"}
    reuse = {"length": 6, "keep_from": 2, "overrides": [[5, "b"]], "reuse": True}
    assert ["c"] == receiver.apply(history, later)[4:5]
    view = receiver.apply(history, {**reuse, "base": b"1", "dropped": [], "token": b"2"})
    assert ["a", history[4], "b"] == view[3:]
    with pytest.raises(ValueError, match="does not hold"):
        receiver.apply(history, {**reuse, "base": b"gone", "dropped": [], "token": b"4"})


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"role": "user", "content": "x", "n": 1}, {"role": "user", "content": "x", "n": 1.0}),
        ({"role": "user", "content": "x", "n": 1}, {"role": "user", "content": "x", "n": True}),
        ({"role": "user", "content": "x"}, {"content": "x", "role": "user"}),
    ],
    ids=["int-to-float", "int-to-bool", "key-order"],
)
def test_an_equal_message_that_encodes_differently_is_sent_again(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    """Only the very objects sent count as unchanged: an equal stand-in goes over the wire."""
    sender = DeltaSender()
    history = [dict(message) for message in MESSAGES] + [old, dict(MESSAGES[0]), dict(MESSAGES[1])]
    sender.sent(history, sender.args_for(history))
    assert new == old
    assert message_digest(new) != message_digest(old)
    replaced = [*history[:3], new, *history[4:]]
    args = sender.args_for(replaced)
    assert args["base"] == 3
    assert args["append"][0] is new
    assert args["base_digest"] == DigestChain(replaced).digest(3)


def test_a_delta_from_before_a_reset_is_not_recorded() -> None:
    """A reply to a delta built before reset() leaves the sender sending whole lists."""
    sender = DeltaSender()
    history = list(MESSAGES)
    sender.sent(history[:2], sender.args_for(history[:2]))
    in_flight = sender.args_for(history)
    assert in_flight["base"] == 2
    sender.reset()
    sender.sent(history, in_flight)  # the reply arrives after the reset
    assert {"messages": history} == sender.args_for(history)
    # A full list always records, whatever happened since it was built.
    sender.sent(history, {"messages": history})
    assert sender.args_for(history)["base"] == len(history)


def test_a_delta_against_a_prefix_since_cut_is_not_recorded() -> None:
    """A reply whose base no longer matches the record (a shorter sync landed first) resets it."""
    sender = DeltaSender()
    history = list(MESSAGES)
    sender.sent(history, sender.args_for(history))
    longer = [*history, {"role": "user", "content": "more"}]
    stale = sender.args_for(longer)
    assert stale["base"] == len(history)
    shorter = history[:1]
    sender.sent(shorter, sender.args_for(shorter))  # cut back to one message
    sender.sent(longer, stale)
    assert {"messages": longer} == sender.args_for(longer)


def test_hashing_ahead_keeps_the_same_record_as_hashing_on_acceptance() -> None:
    """prepare() before sent() leaves the record sent() alone leaves, in-place edits included."""
    ahead, after = DeltaSender(), DeltaSender()
    history = [dict(message) for message in MESSAGES[:1]]
    for step in range(6):
        if step % 2:
            history[-1]["content"] = f"edited in place {step}"  # the rechecked tail
        else:
            history.append({"role": "user" if step % 4 else "assistant", "content": str(step)})
        first, second = ahead.args_for(history), after.args_for(history)
        assert first == second
        ahead.prepare(history, first)
        ahead.sent(history, first, owned=False)
        after.sent(history, second)
        expected = DigestChain(history).digest(len(history))
        args = ahead.args_for(history)
        assert (len(history), expected, []) == (args["base"], args["base_digest"], args["append"])
        assert args == after.args_for(history)


def test_a_record_that_owns_its_list_keeps_it_and_a_copy_otherwise() -> None:
    """sent(owned=True) keeps the very list (the handle's private copy); else a copy."""
    sender = DeltaSender()
    history = list(MESSAGES)
    sender.sent(history, sender.args_for(history), owned=True)
    assert sender._sent is history
    other = DeltaSender()
    other.sent(history, other.args_for(history))
    assert other._sent is not history
    assert other._sent == history
