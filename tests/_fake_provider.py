"""A local HTTP server that plays OpenAI (Chat Completions, Responses) and Anthropic Messages.

It records every request body, checks it against the provider's rules (what
the real APIs refuse with a 400: tests/_rules.py, which the views are held to
too), counts the prompt's tokens roughly (4 characters a token), and answers:

- the provider's real context-length error body when the prompt is over
  ``limit`` tokens;
- otherwise the provider's response shape with ``usage`` (the prompt count),
  as JSON or as the provider's server-sent events when ``stream`` is set.

Its model is a script: request ``k`` (counting the ones answered) calls the
tool ``read_file`` on ``paths[k % len(paths)]`` (so the agent reads the same
files again and again) until ``tool_turns`` calls were made, then answers
with text. A request whose last message asks for a summary (ctxwin's
instruction) is answered with a summary text and is no step of the script;
with ``summary_error`` it is refused. Runs in a thread on 127.0.0.1; no network beyond loopback.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests import _rules as rules
from tests._service import Service

__all__ = ["FakeProvider", "Recorded", "violations"]

SUMMARY_ASK = "Write a summary of this conversation so far"
"""How the fake knows a summary request (ctxwin's instruction opens so); it answers with text."""
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The fake's token count of a request: its prompt's JSON size over 4."""
    parts = [body.get(key) for key in ("system", "instructions", "messages", "input", "tools")]
    return len(json.dumps(parts, separators=(",", ":"))) // 4


DIALECT_OF = {CHAT: "openai-chat", MESSAGES: "anthropic", RESPONSES: "openai-responses"}


def violations(path: str, body: Mapping[str, Any]) -> list[str]:
    """What the provider at ``path`` would refuse in ``body``: the rules of tests/_rules.py
    for a request (every call answered), over ``messages`` or a Responses ``input`` list."""
    if path not in DIALECT_OF:
        return [f"unknown path {path}"]
    items = body.get("input") if path == RESPONSES else body.get("messages")
    if not isinstance(items, list):
        return []  # a Responses input string, or no history
    return rules.problems(DIALECT_OF[path], items, open_end=False)


@dataclass
class Recorded:
    """One request as the provider received it."""

    path: str
    body: dict[str, Any]
    tokens: int
    status: int
    problems: list[str]

    @property
    def history(self) -> list[Any]:
        """The conversation items sent: ``messages`` or a Responses ``input`` list."""
        items = self.body.get("messages", self.body.get("input"))
        return list(items) if isinstance(items, list) else []


@dataclass
class FakeProvider(Service):
    """The server; use as a context manager. ``url`` is its base (``.../v1`` for OpenAI)."""

    limit: int = 100_000
    tool_turns: int = 3
    paths: tuple[str, ...] = ("src/app.py", "src/util.py")
    requests: list[Recorded] = field(default_factory=list)
    summary_error: bool = False
    _answered: int = 0
    # The summary text of the request this thread answers (each request has its own thread).
    _local: threading.local = field(default_factory=threading.local)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def start(self) -> None:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?", 1)[0]
                status, headers, payload = provider.answer(path, body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the tests read self.requests

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_url(self) -> str:
        return self.url + "/v1"

    def sent(self, path: str | None = None) -> list[Recorded]:
        """The recorded requests (to ``path`` only, when given)."""
        with self._lock:
            return [r for r in self.requests if path is None or r.path == path]

    # The model.

    def _text(self, call: bool, target: str) -> str:
        summary: str | None = getattr(self._local, "summary", None)
        if summary is not None:
            return summary
        return "Done: both files read." if not call else f"Reading {target}."

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        tokens = prompt_tokens(body)
        problems = violations(path, body)
        summary = SUMMARY_ASK in json.dumps(Recorded(path, body, 0, 0, []).history[-1:])
        with self._lock:
            if problems or tokens > self.limit or (summary and self.summary_error):
                status = 400
            else:
                status = 200
                turn = self._answered
                if not summary:  # a summary is no step of the script
                    self._answered += 1
            self.requests.append(Recorded(path, body, tokens, status, problems))
        if problems:
            return self._invalid(path, "; ".join(problems))
        if summary and self.summary_error:
            return self._invalid(path, "the summary request was refused")
        if status == 400:
            return self._too_long(path, tokens)
        call = turn < self.tool_turns and not summary
        self._local.summary = None
        if summary:
            read = sorted(set(self.paths[: max(turn, 1)]))
            self._local.summary = f"FAKE SUMMARY: goal kept; files read: {', '.join(read)}."
        target = self.paths[turn % len(self.paths)]
        number = next(self._ids)
        model = str(body.get("model", "fake"))
        stream = bool(body.get("stream"))
        if path == CHAT:
            return self._chat(model, number, call, target, tokens, stream, body)
        if path == RESPONSES:
            return self._responses(model, number, call, target, tokens, stream)
        return self._messages(model, number, call, target, tokens, stream)

    @staticmethod
    def _json(status: int, payload: Any) -> tuple[int, dict[str, str], bytes]:
        return status, {"content-type": "application/json"}, json.dumps(payload).encode()

    @staticmethod
    def _sse(events: list[tuple[str | None, Any]]) -> tuple[int, dict[str, str], bytes]:
        lines: list[str] = []
        for name, data in events:
            if name is not None:
                lines.append(f"event: {name}")
            lines.append("data: " + (data if isinstance(data, str) else json.dumps(data)))
            lines.append("")
        return 200, {"content-type": "text/event-stream"}, ("\n".join(lines) + "\n").encode()

    def _too_long(self, path: str, tokens: int) -> tuple[int, dict[str, str], bytes]:
        if path == MESSAGES:
            return self._json(
                400,
                {
                    "type": "error",
                    "error": {
                        "type": "invalid_request_error",
                        "message": f"prompt is too long: {tokens} tokens > {self.limit} maximum",
                    },
                    "request_id": "req_fake",
                },
            )
        if path == RESPONSES:
            message = (
                "Your input exceeds the context window of this model. "
                "Please adjust your input and try again."
            )
            return self._json(
                400,
                {
                    "error": {
                        "message": message,
                        "type": "invalid_request_error",
                        "param": "input",
                        "code": "context_length_exceeded",
                    }
                },
            )
        message = (
            f"This model's maximum context length is {self.limit} tokens. However, your "
            f"messages resulted in {tokens} tokens. Please reduce the length of the messages."
        )
        return self._json(
            400,
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
        )

    def _invalid(self, path: str, message: str) -> tuple[int, dict[str, str], bytes]:
        if path == MESSAGES:
            error = {"type": "invalid_request_error", "message": message}
            return self._json(400, {"type": "error", "error": error})
        return self._json(
            400,
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            },
        )

    # OpenAI Chat Completions.

    def _chat(
        self,
        model: str,
        number: int,
        call: bool,
        target: str,
        tokens: int,
        stream: bool,
        body: Mapping[str, Any],
    ) -> tuple[int, dict[str, str], bytes]:
        usage = {
            "prompt_tokens": tokens,
            "completion_tokens": 12,
            "total_tokens": tokens + 12,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        call_id = f"call_{number}"
        arguments = json.dumps({"path": target})
        text = self._text(call, target)
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if call:
                message["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": arguments},
                    }
                ]
            return self._json(
                200,
                {
                    "id": f"chatcmpl-{number}",
                    "object": "chat.completion",
                    "created": 1_700_000_000,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if call else "stop",
                        }
                    ],
                    "usage": usage,
                },
            )
        base = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        events: list[tuple[str | None, Any]] = [
            (None, chunk({"role": "assistant", "content": ""})),
            (None, chunk({"content": text})),
        ]
        if call:
            events.append(
                (
                    None,
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": call_id,
                                    "type": "function",
                                    "function": {"name": "read_file", "arguments": arguments},
                                }
                            ]
                        }
                    ),
                )
            )
        events.append((None, chunk({}, "tool_calls" if call else "stop")))
        options = body.get("stream_options")
        if isinstance(options, Mapping) and options.get("include_usage"):
            events.append((None, {**base, "choices": [], "usage": usage}))
        events.append((None, "[DONE]"))
        return self._sse(events)

    # OpenAI Responses.

    def _responses(
        self, model: str, number: int, call: bool, target: str, tokens: int, stream: bool
    ) -> tuple[int, dict[str, str], bytes]:
        text = self._text(call, target)
        output: list[dict[str, Any]] = [
            {
                "type": "message",
                "id": f"msg_{number}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ]
        if call:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{number}",
                    "call_id": f"call_{number}",
                    "name": "read_file",
                    "arguments": json.dumps({"path": target}),
                    "status": "completed",
                }
            )
        response = {
            "id": f"resp_{number}",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": "completed",
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 12,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": tokens + 12,
            },
        }
        if not stream:
            return self._json(200, response)
        created = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[tuple[str | None, Any]] = [
            (
                "response.created",
                {"type": "response.created", "sequence_number": 0, "response": created},
            ),
        ]
        for index, item in enumerate(output):
            events.append(
                (
                    "response.output_item.done",
                    {
                        "type": "response.output_item.done",
                        "sequence_number": index + 1,
                        "output_index": index,
                        "item": item,
                    },
                )
            )
        events.append(
            (
                "response.completed",
                {"type": "response.completed", "sequence_number": 9, "response": response},
            )
        )
        return self._sse(events)

    # Anthropic Messages.

    def _messages(
        self, model: str, number: int, call: bool, target: str, tokens: int, stream: bool
    ) -> tuple[int, dict[str, str], bytes]:
        text = self._text(call, target)
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        if call:
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{number}",
                    "name": "read_file",
                    "input": {"path": target},
                }
            )
        usage = {
            "input_tokens": tokens,
            "output_tokens": 12,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        stop = "tool_use" if call else "end_turn"
        message = {
            "id": f"msg_{number}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not stream:
            return self._json(200, message)
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {**usage, "output_tokens": 1},
        }
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": start}),
        ]
        for index, block in enumerate(content):
            if block["type"] == "text":
                events += [
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": {"type": "text", "text": ""},
                        },
                    ),
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": block["text"]},
                        },
                    ),
                ]
            else:
                events += [
                    (
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": index,
                            "content_block": {**block, "input": {}},
                        },
                    ),
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {
                                "type": "input_json_delta",
                                "partial_json": json.dumps(block["input"]),
                            },
                        },
                    ),
                ]
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events += [
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 12},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return self._sse(events)
