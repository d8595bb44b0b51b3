"""The tools of a verifiers taskset in a trajectory (`[env] kind = "verifiers"`).

A verifiers (v1) taskset may give each task tools: the `@vf.tool` methods of the
`vf.Toolset`s its task class returns from `toolsets(config)`. verifiers serves
them as MCP servers and reads calls from a chat API's `tool_calls`; swarmrl
calls the same methods in-process, offline, and reads calls from the model's
text in the form that Hermes-style chat templates (Qwen2.5, Qwen3 and others)
train their models to write:

    <tool_call>{"name": "multiply", "arguments": {"a": 47, "b": 382}}</tool_call>

The call ends the model's span; the environment answers
`<tool_response>17954</tool_response>` and a newline, and the model goes on. The
prompt lists the tools with their JSON schemas and says how to call them
(`tool_prompt`), so a model without such a template can learn the form too.

Every trajectory gets fresh toolset objects (their `setup_task` hook run for
its task), so a stateful toolset keeps its state per trajectory, as verifiers
keeps it per rollout; the task's rewards read it as `trace.state`. The
answer to a call is a function of the task and the calls before it: a worker
and a validator replay the same calls on fresh toolsets and get the same text
(`run_calls`). Messages are swarmrl's own, with no library version in them (a
pydantic error text names its version; a validator on another would take an
honest answer for a forgery): a malformed call, an unknown tool, arguments that
do not fit the tool's signature (each field and pydantic's error type), and an
exception in the tool (its type and message).

The calls run in the taskset's checker process (tasks/sources/environments.py),
bounded by `env.tool_timeout_s` per answer; a call past it is answered
`error: time limit`, which a validator cannot vouch for (a slower machine), so a
file whose answer differs there is refused as unverifiable, not as a forgery.

Refused, with the reason (tasks/sources/environments.py: `tool_problems`):
toolsets shared by the whole taskset (one server for every rollout), toolsets
with their own `setup` or `register`, a `url` (a remote server) or a runtime
other than a local subprocess.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from typing import Any

from swarmrl.envs.tools import RESULT_CHARS

CALL = re.compile(r"<tool_call>(.*?)</tool_call>\s*\Z", re.DOTALL)
ANY_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TIME_LIMIT = "error: time limit"


def call_at_end(text: str) -> str | None:
    """The JSON text of the call that ends `text` (a model span so far), if one does."""
    m = CALL.search(text)
    return None if m is None else m.group(1)


def response_text(output: str) -> str:
    """The environment's span for a tool's output."""
    return f"<tool_response>{output[:RESULT_CHARS]}</tool_response>\n"


# ---- in the process that loads the taskset (the checker, or the launcher) ----


class ToolSession:
    """One trajectory's tools: fresh toolset objects of `task` (a verifiers Task)."""

    def __init__(self, task, setup: bool = True):
        from verifiers.v1.utils.decorators import discover_decorated

        self.task = task
        self.toolsets = list(type(task).toolsets(task.config))
        self.tools: dict[str, tuple[Any, Any]] = {}  # name -> (bound method, arguments model)
        for ts in self.toolsets:
            if setup and type(ts).setup_task is not _base_setup_task():
                asyncio.run(ts.setup_task(task))
            prefix = ts.server_name
            for fn in discover_decorated(ts, "tool"):
                name = getattr(fn, "tool_name", None) or fn.__name__
                self.tools[f"{prefix}_{name}" if prefix else name] = (fn, _arguments_model(fn))

    def schemas(self) -> list[dict]:
        """The tools as chat APIs list them: name, description, JSON schema."""
        out = []
        for name, (fn, model) in self.tools.items():
            params = model.model_json_schema()
            params.pop("title", None)
            out.append({"name": name, "description": (fn.__doc__ or "").strip(),
                        "parameters": params})  # fmt: skip
        return out

    def call(self, text: str) -> str:
        """The output of the call written `text` (the JSON between the tags)."""
        from pydantic import ValidationError

        try:
            call = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
            return "error: the call is not JSON"
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("name"), str)
            or not isinstance(call.get("arguments", {}), dict)
        ):
            return 'error: a call is {"name": TOOL, "arguments": {...}}'
        name = call["name"]
        if name not in self.tools:
            return f"error: no tool named {name[:80]!r}; the tools are {sorted(self.tools)}"
        fn, model = self.tools[name]
        try:
            args = model.model_validate(call.get("arguments", {}))
        except ValidationError as e:
            fields = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['type']}"
                for err in e.errors(include_url=False)
            )
            return f"error: invalid arguments for {name}: {fields}"
        try:
            got = fn(**{k: getattr(args, k) for k in type(args).model_fields})
            if inspect.isawaitable(got):
                got = asyncio.run(got)
        except Exception as e:  # recovered: the tool's own failure is its answer
            return f"error: {type(e).__name__}: {e}"
        return _as_text(got)

    def state(self):
        """The task's state after the calls (every toolset's fields, in order)."""
        from verifiers.v1.state import state_cls

        fields: dict = {}
        for ts in self.toolsets:
            fields.update(ts.state.model_dump())
        return state_cls(type(self.task)).model_validate(fields)


def _base_setup_task():
    from verifiers.v1.mcp.server import ServerBase

    return ServerBase.setup_task


def _arguments_model(fn):
    """A pydantic model of `fn`'s parameters (lax, as MCP validates them; extra keys
    are ignored)."""
    from pydantic import create_model

    fields = {}
    for p in inspect.signature(fn, eval_str=True).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        annotation = Any if p.annotation is p.empty else p.annotation
        fields[p.name] = (annotation, ... if p.default is p.empty else p.default)
    return create_model(f"{fn.__name__}_arguments", **fields)


def _as_text(got) -> str:
    """A tool's return value as the text of its answer (a list: one item per line)."""
    if got is None:
        return ""
    if isinstance(got, str):
        return got
    if isinstance(got, list | tuple):
        return "\n".join(_as_text(x) for x in got)
    if isinstance(got, dict):
        return json.dumps(got, sort_keys=True, default=str)
    return str(got)


def run_calls(task, calls: list[str]) -> list[str]:
    """Each call's output, on fresh toolsets of `task`, in order."""
    session = ToolSession(task)
    return [session.call(c) for c in calls]


def split_turns(task, text: str) -> tuple[list[tuple[str, str | None, str | None]], Any]:
    """A trajectory's text as turns (the model's text, its call, the tool's output),
    replayed on fresh toolsets, and the task's state after them. A call without its
    answer after it (the turn limit or the length budget ended the trajectory) is the
    last turn, with output None."""
    session = ToolSession(task)
    turns, pos = [], 0
    while True:
        m = ANY_CALL.search(text, pos)
        if m is None:
            turns.append((text[pos:], None, None))
            break
        output = session.call(m.group(1))
        answer = response_text(output)
        gap = len(text[m.end() :]) - len(text[m.end() :].lstrip())
        if not text.startswith(answer, m.end() + gap):
            turns.append((text[pos : m.start()], m.group(1), None))
            break
        turns.append((text[pos : m.start()], m.group(1), output))
        pos = m.end() + gap + len(answer)
    return turns, session.state()


def tool_prompt(schemas: list[dict]) -> str:
    """What the prompt says about the tools: their schemas and the call form."""
    listed = "\n".join(json.dumps(s, sort_keys=True) for s in schemas)
    return (
        "You may call these tools:\n"
        f"{listed}\n"
        'To call one, write <tool_call>{"name": TOOL, "arguments": {...}}</tool_call>; '
        "its result follows as <tool_response>...</tool_response>, and you go on."
    )


def probe_calls(schemas: list[dict]) -> list[str]:
    """Calls every tool with arguments of the right JSON types, and two malformed
    calls: the probes a run's start answers twice (`check_deterministic`)."""
    sample = {"integer": 7, "number": 2.5, "string": "probe", "boolean": True,
              "array": [], "object": {}}  # fmt: skip
    out = []
    for s in schemas:
        props = s["parameters"].get("properties", {})
        args = {k: sample.get(v.get("type"), None) for k, v in props.items()}
        out.append(json.dumps({"name": s["name"], "arguments": args}))
    return out + ["not json", json.dumps({"name": "no_such_tool", "arguments": {}})]


# ---- in a worker or a validator: the calls go to the checker process ----


class VerifiersEnvironment:
    """`[env] kind = "verifiers"`: the taskset's tools, answered by its checker
    process. `bind(task)` gives the environment of one trajectory of that task."""

    def __init__(self, max_turns: int, timeout_s: float, checker=None):
        from swarmrl.tasks.graders.checker import CheckerProcess

        self.max_turns = max_turns
        self.checker = checker or CheckerProcess("swarmrl.tasks.sources.environments", timeout_s)

    def ends(self, model_span: str) -> bool:
        return call_at_end(model_span) is not None

    def bind(self, task) -> BoundTools:
        info = task.verification_info
        self.checker.warm(["load", info["env"], info["args"]])  # loading is not a call's time
        return BoundTools(self, info)

    def outputs(self, info: dict, calls: list[str]) -> list[str] | None:
        """The outputs of `calls` in order on fresh toolsets of the row (None: they
        took longer than the time limit)."""
        return self.checker.call(["tools", info, calls])


class BoundTools:
    """The tools of one trajectory: answers a call from the calls before it."""

    def __init__(self, env: VerifiersEnvironment, info: dict):
        self.env, self.info = env, info
        self.calls: list[str] = []  # the call of each model span so far, by turn

    def ends(self, model_span: str) -> bool:
        return call_at_end(model_span) is not None

    def respond(self, model_span: str, turn: int) -> str | None:
        """The environment's span after model span `turn` (0-based), or None when the
        trajectory ends there (no call, or the turn limit)."""
        call = call_at_end(model_span)
        if call is None or turn + 1 >= self.env.max_turns:
            return None
        self.calls = self.calls[:turn] + [call]
        got = self.env.outputs(self.info, self.calls)
        return response_text(TIME_LIMIT if got is None else got[-1])

    def doubt(self, model_span: str, turn: int, answer: str, claimed: str) -> str | None:
        """Why the file's span `claimed` may differ from `answer` through no fault of
        the worker: the tools ran into their time limit on either side, or answer
        differently here on a second run."""
        limit = response_text(TIME_LIMIT)
        if answer == limit or claimed == limit:
            return "the taskset's tools ran into their time limit (on the worker or here)"
        if self.respond(model_span, turn) != answer:
            return "the taskset's tools answer differently on a second run"
        return None


def check_deterministic(env: VerifiersEnvironment, info: dict, schemas: list[dict]) -> None:
    """Refuse tools whose answers to the same probe calls differ between two runs."""
    from swarmrl.errors import ConfigError

    probes = probe_calls(schemas)
    first, second = env.outputs(info, probes), env.outputs(info, probes)
    if first is None or second is None:
        raise ConfigError(
            f"the taskset's tools did not answer the probe calls {probes} within "
            f"env.tool_timeout_s ({env.checker.timeout_s} s)"
        )
    for probe, a, b in zip(probes, first, second, strict=True):
        if a != b:
            raise ConfigError(
                f"the taskset's tools are not deterministic: {probe} was answered {a!r} and "
                f"then {b!r}; a validator could not recompute their answers"
            )
