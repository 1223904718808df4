"""A deterministic, realistic coding-agent conversation for benchmarks.

``build_conversation`` makes the kind of history the engine sees in practice:
a task, then alternating assistant turns (tool calls) and user turns (their
results), with the same files read again and again in every format the
engine knows (SPEC.md §6):

- ``read_file`` results in the new format (one text block: header, newline,
  content), the old format (block 0 the bare header, block 1 the content)
  and as native ``tool_use`` / ``tool_result`` pairs;
- ``write_to_file`` / ``replace_in_file`` results holding
  ``<final_file_content path="...">`` elements;
- file mentions (``<file_content path="...">``) in the user's own text;
- command output, user feedback with non-ASCII text and emoji, and a few
  base64 images.

The same ``seed`` always gives the same messages, so figures taken on
different days or by different benchmarks compare. Every message is a fresh
JSON-compatible object: callers may serialise it or replay it turn by turn.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

_START_TS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, in milliseconds
_TURN_MS = 17_000

_PATHS = (
    "src/app.ts",
    "src/server/routes.ts",
    "src/server/db.ts",
    "src/server/auth/session.ts",
    "src/components/Button.tsx",
    "src/components/IncidentForm.tsx",
    "src/components/MapView.tsx",
    "src/lib/format.ts",
    "src/lib/i18n/ja.json",
    "src/lib/i18n/fr.json",
    "src/hooks/useIncidents.ts",
    "src/styles/theme.css",
    "tests/routes.test.ts",
    "tests/format.test.ts",
    "package.json",
    "tsconfig.json",
    "README.md",
    "docs/architecture.md",
    "docs/notes café.md",
    "docs/設計メモ.md",
    "scripts/deploy.sh",
    "terraform/main.tf",
    "terraform/variables.tf",
    "Dockerfile",
    ".github/workflows/ci.yml",
    "apphosting.yaml",
    "src/server/jobs/cleanup.ts",
    "src/server/mail/templates.ts",
)
# A few files are read far more often than the rest, as in real sessions.
_HOT = 6

_CODE_WORDS = (
    "const", "let", "return", "await", "async", "function", "import", "export",
    "from", "if", "else", "for", "of", "new", "throw", "type", "interface",
    "incident", "report", "session", "user", "config", "result", "error", "db",
    "query", "params", "request", "response", "status", "items", "map", "filter",
    "options", "timeout", "retry", "logger", "cache", "token", "value", "key",
)  # fmt: skip
_COMMENTS = (
    "// TODO: handle the offline case",
    "// 注意: タイムゾーンはUTCで保存する",
    "// naïve retry; see the runbook",
    "/* keep in sync with the API schema ✅ */",
    "# déploiement: vérifier les variables",
    "// 🚀 fast path for cached sessions",
)
_FEEDBACK = (
    "Looks good so far, but the form still shows the old label.",
    "Das funktioniert noch nicht ganz: der Export bricht ab.",
    "Merci ! Peux-tu aussi vérifier la page « carte » ?",
    "テストが一つ失敗しています。ログを確認してください。",
    "Great work 🎉 now please run the linter 🧹 and fix what it reports.",
    "The map pins are misplaced 📍 near the coast; check the projection.",
    "Почему сборка такая медленная? Посмотри конфигурацию.",
)
_THOUGHTS = (
    "Let me look at how this is wired before changing anything.",
    "The error points at the session handling; I'll read that file again.",
    "I'll update the component and keep the existing props intact.",
    "Now I'll check the tests that cover this path.",
    "The configuration needs the new bucket name; let me edit it.",
    "I should verify the build still passes after these edits ✅.",
)


def _line(rng: random.Random) -> str:
    if rng.random() < 0.08:
        return rng.choice(_COMMENTS)
    indent = "  " * rng.randint(0, 3)
    words = " ".join(rng.choice(_CODE_WORDS) for _ in range(rng.randint(3, 9)))
    return f"{indent}{words};"


def _lines(rng: random.Random, count: int) -> str:
    return "\n".join(_line(rng) for _ in range(count))


@dataclass(slots=True)
class _Files:
    """The workspace's files: each one's current content and how often it changed.

    Every piece of generated text draws from its own generator, keyed by what
    it is, so the message structure does not depend on ``scale``: only the
    lengths do, which keeps the size search in ``build_conversation`` smooth.
    """

    seed: int
    scale: float
    contents: dict[str, str] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    def rng(self, *key: object) -> random.Random:
        return random.Random(":".join(map(str, (self.seed, *key))))

    def content(self, path: str) -> str:
        found = self.contents.get(path)
        if found is None:
            rng = self.rng("file", path)
            base = rng.randint(30, 90) if path in _PATHS[:_HOT] else rng.randint(10, 60)
            found = self.contents[path] = _lines(rng, max(3, round(base * self.scale)))
        return found

    def change(self, path: str) -> str:
        """Edit the file: a new version with about a tenth of its lines rewritten."""
        lines = self.content(path).split("\n")
        version = self.versions[path] = self.versions.get(path, 0) + 1
        rng = self.rng("edit", path, version)
        for _ in range(max(1, len(lines) // 10)):
            lines[rng.randrange(len(lines))] = _line(rng)
        text = "\n".join(lines)
        self.contents[path] = text
        return text


def _numbered(text: str) -> str:
    return "\n".join(f"{number} | {line}" for number, line in enumerate(text.split("\n"), 1))


def _environment(index: int, path: str) -> str:
    minutes = index * _TURN_MS // 60_000
    return (
        f"<environment_details>\n# Visible Files\n{path}\n# Current Time\n"
        f"1/1/2026, {minutes // 60 % 24}:{minutes % 60:02d} (UTC)\n</environment_details>"
    )


def _image(rng: random.Random, scale: float) -> dict[str, Any]:
    raw = rng.randbytes(max(256, round(6_000 * scale)))
    return {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(raw).decode("ascii"),
        },
    }


def _write_result(tool: str, path: str, content: str) -> str:
    return (
        f"The content was successfully saved to {path}.\n\n"
        "Here is the full, updated content of the file that was saved:\n\n"
        f'<final_file_content path="{path}">\n{content}\n</final_file_content>\n\n'
        "IMPORTANT: For any future changes to this file, use the final_file_content "
        f"shown above as your reference. ({tool})"
    )


class _Builder:
    def __init__(self, seed: int, scale: float) -> None:
        self.rng = random.Random(seed)
        self.scale = scale
        self.files = _Files(seed, scale)
        self.tool_ids = 0
        self.images_left = 0

    def path(self) -> str:
        rng = self.rng
        if rng.random() < 0.4:
            return rng.choice(_PATHS[:_HOT])
        return rng.choice(_PATHS)

    def tool_id(self) -> str:
        self.tool_ids += 1
        return f"toolu_{self.tool_ids:06d}"

    def first(self) -> Message:
        path = _PATHS[0]
        task = (
            "<task>\nRefactor the incident reporting app so that it runs on the new "
            "infrastructure: rename the buckets and databases, update the deployment "
            "files, and keep the French and Japanese translations (日本語) working. 🙏\n"
            "</task>"
        )
        return {
            "role": "user",
            "content": [
                {"type": "text", "text": task},
                {"type": "text", "text": _environment(0, path)},
            ],
        }

    def turn(self, index: int) -> tuple[Message, Message]:
        """An assistant turn at ``index`` and the user turn that answers it."""
        rng = self.rng
        roll = rng.random()
        thought = {"type": "text", "text": rng.choice(_THOUGHTS)}
        env = {"type": "text", "text": _environment(index + 1, self.path())}
        path = self.path()
        if roll < 0.25:  # read_file
            content = _numbered(self.files.content(path))
            header = f"[read_file for '{path}'] Result:"
            style = rng.random()
            if style < 0.4:
                assistant = _xml_call(thought, "read_file", path)
                blocks = [{"type": "text", "text": f"{header}\n{content}"}, env]
            elif style < 0.6:
                assistant = _xml_call(thought, "read_file", path)
                blocks = [
                    {"type": "text", "text": header},
                    {"type": "text", "text": content},
                    env,
                ]
            else:
                return self._native(thought, env, "read_file", path, header, content)
        elif roll < 0.36:  # write_to_file / replace_in_file
            tool = rng.choice(("write_to_file", "replace_in_file"))
            content = self.files.change(path)
            header = f"[{tool} for '{path}'] Result:"
            body = _write_result(tool, path, content)
            style = rng.random()
            if style < 0.5:
                return self._native(thought, env, tool, path, header, body)
            assistant = _xml_call(thought, tool, path)
            if style < 0.85:
                blocks = [{"type": "text", "text": f"{header}\n{body}"}, env]
            else:
                blocks = [{"type": "text", "text": header}, {"type": "text", "text": body}, env]
        elif roll < 0.42:  # the user mentions files in feedback
            assistant = {"role": "assistant", "content": [thought]}
            mentioned = [path, *([self.path()] if rng.random() < 0.4 else [])]
            parts = [rng.choice(_FEEDBACK)]
            for name in mentioned:
                parts.append(
                    f'<file_content path="{name}">\n{self.files.content(name)}\n</file_content>'
                )
            text = "<feedback>\n" + "\n\n".join(parts) + "\n</feedback>"
            blocks = [{"type": "text", "text": "[attempt_completion] Result:"}]
            blocks += [{"type": "text", "text": text}, env]
        elif roll < 0.45 and self.images_left > 0:  # a screenshot
            self.images_left -= 1
            assistant = {"role": "assistant", "content": [thought]}
            blocks = [
                {"type": "text", "text": f"<feedback>\n{rng.choice(_FEEDBACK)}\n</feedback>"},
                _image(self.files.rng("image", index), self.scale),
                env,
            ]
        elif roll < 0.88:  # a command and its output
            command = rng.choice(("npm test", "npm run build", "npm run lint", "git status"))
            lines = max(1, round(rng.randint(6, 60) * self.scale))
            output = _lines(self.files.rng("output", index), lines)
            header = f"[execute_command for '{command}'] Result:"
            body = f"Command executed.\nOutput:\n{output}\n✓ done"
            if rng.random() < 0.5:
                return self._native(thought, env, "execute_command", command, header, body)
            assistant = _xml_call(thought, "execute_command", command)
            blocks = [{"type": "text", "text": f"{header}\n{body}"}, env]
        else:  # plain feedback, often non-ASCII
            assistant = {"role": "assistant", "content": [thought]}
            feedback = f"<feedback>\n{rng.choice(_FEEDBACK)}\n</feedback>"
            blocks = [{"type": "text", "text": feedback}, env]
        return assistant, {"role": "user", "content": blocks}

    def _native(
        self,
        thought: dict[str, Any],
        env: dict[str, Any],
        tool: str,
        path: str,
        header: str,
        body: str,
    ) -> tuple[Message, Message]:
        """A native ``tool_use`` turn and the ``tool_result`` that answers it."""
        tool_id = self.tool_id()
        key = "command" if tool == "execute_command" else "path"
        assistant = {
            "role": "assistant",
            "content": [
                thought,
                {"type": "tool_use", "id": tool_id, "name": tool, "input": {key: path}},
            ],
        }
        result = {
            "type": "tool_result",
            "tool_use_id": tool_id,
            "content": [{"type": "text", "text": f"{header}\n{body}"}],
        }
        return assistant, {"role": "user", "content": [result, env]}


def _xml_call(thought: dict[str, Any], tool: str, path: str) -> Message:
    key = "command" if tool == "execute_command" else "path"
    call = f"<{tool}>\n<{key}>{path}</{key}>\n</{tool}>"
    return {
        "role": "assistant",
        "content": [{"type": "text", "text": f"{thought['text']}\n\n{call}"}],
    }


def _build(messages: int, seed: int, scale: float) -> list[Message]:
    builder = _Builder(seed, scale)
    builder.images_left = max(1, messages // 400)
    history: list[Message] = [builder.first()] if messages > 0 else []
    while len(history) < messages:
        assistant, user = builder.turn(len(history))
        history.append(assistant)
        if len(history) < messages:
            history.append(user)
    for index, message in enumerate(history):
        message["ts"] = _START_TS + index * _TURN_MS
    return history


def size_of(messages: list[Message]) -> int:
    """The conversation's size in bytes as compact UTF-8 JSON."""
    return len(json.dumps(messages, ensure_ascii=False, separators=(",", ":")).encode())


def build_conversation(
    messages: int = 2000, target_bytes: int = 1_000_000, seed: int = 0
) -> list[Message]:
    """A deterministic agent conversation of ``messages`` messages and about ``target_bytes``.

    Args:
        messages: how many messages, alternating user / assistant, user first.
        target_bytes: the size to aim for as compact UTF-8 JSON (within a few
            percent once the conversation is more than a few dozen messages).
        seed: the same seed always gives the same conversation.

    Returns:
        A new list of new messages (the caller owns them).
    """
    # Only file contents and images grow with ``scale``; the rest is fixed, so
    # the size is close to linear in it: solve for the target, then refine.
    low, high = 0.25, 1.0
    size_low = size_of(_build(messages, seed, low))
    size_high = size_of(_build(messages, seed, high))
    scale = high
    history: list[Message] = []
    for _ in range(4):
        slope = (size_high - size_low) / (high - low) if high != low else 0.0
        scale = max(0.02, high + (target_bytes - size_high) / slope) if slope > 0 else high
        history = _build(messages, seed, scale)
        size = size_of(history)
        if abs(size - target_bytes) <= target_bytes * 0.01:
            break
        low, size_low, high, size_high = high, size_high, scale, size
    return history
