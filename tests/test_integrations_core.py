"""The adapters' shared parts: no SDK imported by the client, task ids, model windows, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anthropic
import openai
import pytest

from ctxwin.client.integrations import derive_task_id, is_window_error, known_context_window
from tests._fake_provider import CHAT, MESSAGES, RESPONSES, FakeProvider, violations
from tests._rules import CHECKS

SDKS = ("openai", "anthropic", "agents", "langchain", "langchain_core", "pydantic_ai", "httpx")


def test_importing_the_client_and_the_integrations_package_imports_no_sdk() -> None:
    """``import ctxwin.client`` and ``import ctxwin.client.integrations`` load none of the SDKs."""
    code = (
        "import sys, json, ctxwin.client, ctxwin.client.integrations\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {SDKS!r})))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert [] == json.loads(run.stdout)


def test_the_derived_task_id_is_stable_valid_and_names_the_head() -> None:
    """The same head gives the same id; another head another; ids are valid task ids."""
    head = [{"role": "system", "content": "terse"}, {"role": "user", "content": "fix it"}]
    first = derive_task_id("openai-chat", head)
    assert first == derive_task_id("openai-chat", json.loads(json.dumps(head)))
    assert first != derive_task_id("openai-chat", [*head[:1], {"role": "user", "content": "x"}])
    assert first.startswith("openai-chat-")
    assert 32 == len(first.removeprefix("openai-chat-"))


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("openai:gpt-4.1", 1_047_576),
        ("ft:gpt-4o-mini:org::abc", 128_000),
        ("claude-sonnet-4-5", 200_000),
        ("gpt-5-mini", 400_000),
        ("some-local-model", None),
    ],
)
def test_known_windows_match_the_longest_prefix(model: str, window: int | None) -> None:
    """A model id takes the window of its longest known prefix, None when unknown."""
    assert window == known_context_window(model)


def _raised(call: object) -> BaseException:
    try:
        call()  # type: ignore[operator]
    except Exception as exc:
        return exc
    raise AssertionError("no error")


def test_the_providers_context_length_errors_are_window_errors_and_others_are_not() -> None:
    """The SDKs' exceptions for the real too-long bodies count; a refused orphan result does not."""
    with (
        FakeProvider(limit=100) as provider,
        # Closed on the way out: an SDK client left open leaks its connection's socket,
        # and the ResourceWarning surfaces in whichever test the collector then runs in.
        openai.OpenAI(base_url=provider.openai_url, api_key="k", max_retries=0) as chat,
        anthropic.Anthropic(base_url=provider.url, api_key="k", max_retries=0) as claude,
    ):
        long: Any = [{"role": "user", "content": "x" * 1000}]
        assert is_window_error(
            _raised(lambda: chat.chat.completions.create(model="m", messages=long))
        )
        assert is_window_error(_raised(lambda: chat.responses.create(model="m", input=long)))
        assert is_window_error(
            _raised(lambda: claude.messages.create(model="m", max_tokens=1, messages=long))
        )
        orphan: Any = [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]
        refused = _raised(lambda: chat.chat.completions.create(model="m", messages=orphan))
        assert isinstance(refused, openai.BadRequestError)
        assert not is_window_error(refused)
        assert not is_window_error(ValueError("prompt is too long"))


def test_the_fake_provider_refuses_orphan_results_and_calls_without_results() -> None:
    """Each dialect's pairing check finds an orphan result and a call left without its result."""
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    assert violations(CHAT, {"messages": [{"role": "tool", "tool_call_id": "c1"}]})
    assert violations(CHAT, {"messages": [call, {"role": "user", "content": "x"}]})
    assert [] == violations(CHAT, {"messages": [call, {"role": "tool", "tool_call_id": "c1"}]})
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}
    first = {"role": "user", "content": "go"}
    assert violations(MESSAGES, {"messages": [first, result]})
    assert violations(MESSAGES, {"messages": [first, use, first]})
    assert [] == violations(MESSAGES, {"messages": [first, use, result]})
    output = {"type": "function_call_output", "call_id": "c1", "output": "x"}
    function_call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    assert violations(RESPONSES, {"input": [output]})
    assert violations(RESPONSES, {"input": [function_call]})
    assert [] == violations(RESPONSES, {"input": [function_call, output]})


def _holds(dialect: str, view: list[dict[str, Any]]) -> bool:
    try:
        CHECKS[dialect](view)
    except AssertionError:
        return False
    return True


def test_the_fake_provider_and_the_view_checks_apply_the_same_provider_rules() -> None:
    """Cases the fake provider once judged by rules of its own: each is judged alike as a
    request and as a view, by the providers' documented rules. The one difference is meant:
    a view's newest calls are the caller's to answer, a request's must be answered."""
    user = {"role": "user", "content": "go"}
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]}
    result = {"type": "tool_result", "tool_use_id": "t1"}
    note = {"role": "assistant", "content": [{"type": "text", "text": "(reading)"}]}
    text_first = {"role": "user", "content": [{"type": "text", "text": "here"}, result]}
    calls = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}
    custom = {"type": "custom_tool_call", "call_id": "c1", "name": "f", "input": "x"}
    custom_output = {"type": "custom_tool_call_output", "call_id": "c1", "output": "x"}
    cases: list[tuple[str, str, list[dict[str, Any]], bool]] = [
        # Consecutive assistant messages are one turn, whose calls the next user turn answers.
        (MESSAGES, "anthropic", [user, use, note, {"role": "user", "content": [result]}], True),
        # The results come first in their user turn.
        (MESSAGES, "anthropic", [user, use, text_first], False),
        # An assistant message has content or calls.
        (CHAT, "openai-chat", [user, {"role": "assistant", "content": None}, user], False),
        # Every kind of call item wants its output, once.
        (RESPONSES, "openai-responses", [custom, user], False),
        (RESPONSES, "openai-responses", [custom, custom_output, custom_output], False),
        (RESPONSES, "openai-responses", [custom, custom_output, user], True),
    ]
    for path, dialect, history, valid in cases:
        body = {"input" if path == RESPONSES else "messages": history}
        assert (valid, valid) == (not violations(path, body), _holds(dialect, history)), history
    open_ends: list[tuple[str, str, list[dict[str, Any]]]] = [
        (CHAT, "openai-chat", [user, calls]),
        (MESSAGES, "anthropic", [user, use]),
        (RESPONSES, "openai-responses", [user, custom]),
    ]
    for path, dialect, ending in open_ends:
        body = {"input" if path == RESPONSES else "messages": ending}
        assert violations(path, body), ending
        assert _holds(dialect, ending), ending


def _adapters() -> list[Any]:
    """Each adapter's entry point: the SDK wrappers' ``wrap``, the frameworks' classes."""
    from ctxwin.client.integrations import agents, langchain, pydantic_ai
    from ctxwin.client.integrations import anthropic as anthropic_adapter
    from ctxwin.client.integrations import openai as openai_adapter

    return [
        openai_adapter.wrap,
        anthropic_adapter.wrap,
        agents.ContextWindowFilter,
        langchain.ContextWindowMiddleware,
        pydantic_ai.ContextWindow,
    ]


def test_every_adapter_takes_and_documents_each_window_option_once() -> None:
    """The window options are written once: each adapter's signature shows them with their
    defaults and its docstring documents each exactly once."""
    import inspect

    from ctxwin.client.integrations._window_args import WindowArgs

    for adapter in _adapters():
        parameters = inspect.signature(adapter).parameters
        doc = adapter.__doc__ or ""
        for name in WindowArgs.__annotations__:
            assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, (adapter, name)
            assert parameters[name].default is (False if name == "ephemeral" else None)
            assert sum(line.strip().startswith(f"{name}: ") for line in doc.split("\n")) == 1


def test_an_adapter_refuses_a_misspelt_window_option() -> None:
    """A window option the adapters do not know is a TypeError, as for any keyword."""
    from ctxwin.client.integrations import pydantic_ai

    with pytest.raises(TypeError, match="ephemerall"):
        pydantic_ai.ContextWindow(ephemerall=True)  # type: ignore[call-arg]
