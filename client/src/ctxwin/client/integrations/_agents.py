"""A ``call_model_input_filter`` for the OpenAI Agents SDK: ctxwin's view as each model input."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from agents import (
    Agent,
    Model,
    ModelProvider,
    ModelTracing,
    MultiProvider,
    RunConfig,
    RunContextWrapper,
    RunHooks,
)
from agents.items import ModelResponse
from agents.run_config import CallModelData, ModelInputData

from ctxwin.proto import Usage

from ._conversations import Request
from ._openai import usage_from_responses
from ._plain import Plain
from ._window import WindowOptions
from ._window_args import WindowArgs, takes_window_args

__all__ = ["ContextWindowFilter"]

DIALECT = "openai-responses"
PREFIX = "agents"


def _model_id(agent: Agent[Any]) -> str:
    model = agent.model
    if isinstance(model, str):
        return model
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else ""


def _output_text(response: ModelResponse) -> str:
    """The text of a response's output messages."""
    texts: list[str] = []
    for item in response.output:
        for part in getattr(item, "content", None) or ():
            text = getattr(part, "text", None)
            if getattr(part, "type", None) == "output_text" and isinstance(text, str):
                texts.append(text)
    return "\n".join(texts)


def _head(instructions: str | None, items: Sequence[Any]) -> list[Any]:
    head: list[Any] = [instructions]
    for item in items:
        head.append(item)
        if isinstance(item, Mapping) and item.get("role") == "user":
            break
    return head


def _key(item: Any) -> tuple[Any, ...]:
    if not isinstance(item, Mapping):
        return (None,)
    return (item.get("type"), item.get("role"), item.get("id"), item.get("call_id"))


def _same_objects(view: Sequence[Any], given: Sequence[Any]) -> list[Any]:
    """The view with each item equal to a given one replaced by that very object.

    ctxwin rebuilds whole turns when it changes one item of them (a notice in a
    function call's output), so an unchanged item of that turn comes back as
    an equal copy; the SDK tracks items by identity and must get its own.
    """
    ids = {id(item) for item in given}
    by_key: dict[tuple[Any, ...], list[Any]] = {}
    for item in given:
        by_key.setdefault(_key(item), []).append(item)
    out: list[Any] = []
    for item in view:
        if id(item) not in ids:
            item = next((same for same in by_key.get(_key(item), ()) if same == item), item)
        out.append(item)
    return out


class _UsageHooks(RunHooks[Any]):
    """Run hooks that hand each model response's usage to the filter."""

    def __init__(self, owner: ContextWindowFilter) -> None:
        self._owner = owner

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        self._owner.answered(agent, response)


@takes_window_args
class ContextWindowFilter:
    """``RunConfig(call_model_input_filter=ContextWindowFilter())``: send ctxwin's view.

    Before each model call the agent's input items (dialect ``openai-responses``)
    go to ctxwin, and the view comes back as the model input; the instructions
    pass through. Items the view keeps are the very objects the SDK gave (the
    SDK tracks them by identity, and refuses rebuilt copies of pending items
    with server-held conversations); only items ctxwin changed (a notice
    written into a re-read file's output) or filled in (a missing output) are
    new. The usage of each response reaches the next call through
    :attr:`hooks` (``Runner.run(..., hooks=f.hooks)``, or :meth:`run_config`);
    without them ctxwin estimates each input, calibrated by the task's earlier
    reports. A provider error that the input was too long propagates from the
    run; the next run's filter sees the task at its stored range.

    Args:
        task: the ctxwin task id; None derives one per conversation from the
            instructions and the items up to the first user message
            (``agents-<digest>``).
        on_turn: called with a :class:`~ctxwin.client.integrations.Turn` after
            each model call (on the next call when no usage arrived).
        summaries: ``"model"``: when a summary is due, the agent's model is
            asked for one (the instructions, the items it last saw and an
            instruction message; no tools), and ctxwin cuts the turns it stands
            for; ``"basic"``: ctxwin writes the summary itself; None: cut without
            one (docs/SUMMARIES.md).
        model_provider: resolves an agent's model given by name for the
            summary request (default: the one given to :meth:`run_config`, else
            the SDK's default ``MultiProvider``). The filter sees the agent, not
            the run's ``RunConfig``: a run whose ``RunConfig`` names another
            provider should pass it here (a ``RunConfig(model=...)`` is not
            seen: the summary goes to the agent's own model).
    """

    def __init__(
        self,
        *,
        model_provider: ModelProvider | None = None,
        **options: Unpack[WindowArgs],
    ) -> None:
        window_options = WindowOptions(PREFIX, DIALECT, **options)
        self._ctxwin_window = window_options.async_window(self)
        self._plain = Plain()
        self._provider = model_provider
        self._pending: dict[int, Request] = {}  # by agent, until its response arrives
        self.hooks: RunHooks[Any] = _UsageHooks(self)
        """Run hooks that report each response's usage (pass as ``hooks=``)."""

    def run_config(self, **options: Any) -> RunConfig:
        """A ``RunConfig`` with this filter (and ``options``); use with ``hooks=self.hooks``."""
        provider = options.get("model_provider")
        if self._provider is None and isinstance(provider, ModelProvider):
            self._provider = provider
        return RunConfig(call_model_input_filter=self, **options)

    def _model(self, agent: Agent[Any]) -> Model:
        """The model the agent's summary request goes to."""
        if isinstance(agent.model, Model):
            return agent.model
        if self._provider is None:
            self._provider = MultiProvider()
        return self._provider.get_model(agent.model)

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        """The model input for this call: the instructions, and ctxwin's view of the items."""
        window = self._ctxwin_window
        earlier = self._pending.pop(id(data.agent), None)
        if earlier is not None:
            window.finish(earlier, None)  # no usage reached us for the call before
        given = list(data.model_data.input)
        items = self._plain(given)
        instructions = data.model_data.instructions
        agent = data.agent

        async def summarize(view: list[Any], name: str) -> tuple[str | None, Usage | None]:
            response = await self._model(agent).get_response(
                instructions,
                view,
                agent.model_settings,
                [],
                None,
                [],
                ModelTracing.DISABLED,
                previous_response_id=None,
                conversation_id=None,
                prompt=None,
            )
            return _output_text(response), usage_from_responses(response.usage)

        request = await window.begin(items, _model_id(agent), _head(instructions, items), summarize)
        self._pending[id(data.agent)] = request
        return ModelInputData(input=_same_objects(request.view, given), instructions=instructions)

    def answered(self, agent: Agent[Any], response: ModelResponse) -> None:
        """Record a model response's usage for the agent's next call (called by :attr:`hooks`)."""
        request = self._pending.pop(id(agent), None)
        if request is not None:
            self._ctxwin_window.finish(request, usage_from_responses(response.usage))
