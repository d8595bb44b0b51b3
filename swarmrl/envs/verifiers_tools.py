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
its task, one event loop for their async code), so a stateful toolset keeps its
state per trajectory, as verifiers keeps it per rollout; the task's rewards read
it as `trace.state`. The answer to a call is a function of the task and the
calls before it: a worker and a validator replay the same calls on fresh
toolsets and get the same text (`run_calls`). Messages are swarmrl's own, with
no library version, address or path in them (a validator on another machine
would take an honest difference for a forgery): a malformed call, an unknown
tool, arguments that do not fit the tool's signature (each field and pydantic's
error type), and an exception in the tool (its type only). The prompt's schemas
are written here from the signatures, not by pydantic, whose output changes
between versions.

The calls run in a checker process of their own (tasks/graders/checker.py, with
the taskset's module), bounded by `env.tool_timeout_s` per answer. A call past
it is answered `error: time limit`, and one whose process died `error: the
tools' process died`; a validator cannot vouch for either (machines differ in
speed and memory), so a file whose answer differs there is refused as
unverifiable, not as a forgery (`BoundTools.doubt`).

Refused, with the reason (tasks/sources/environments.py: `tool_problems`):
toolsets shared by the whole taskset (one server for every rollout), toolsets
with their own `setup` or `register`, a `url` (a remote server), a runtime other
than a local subprocess, and a `toolsets()` that hands back the same object twice.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from swarmrl.envs.tools import JSON_CALL, answer_content, answer_text, read_json_call

OPEN, CLOSE, RESPONSE = "<tool_call>", "</tool_call>", "<tool_response>"
CALL = JSON_CALL  # a span ends with a close tag; its call starts at the last open tag before it
TIME_LIMIT = "error: time limit"
DIED = "error: the tools' process died"  # killed (memory) or ended by the tool itself


def call_at_end(text: str) -> str | None:
    """The JSON text of the call that ends `text` (a model span so far), if one does."""
    m = CALL.search(text)
    return None if m is None else m.group(1)


def response_text(output: str) -> str:
    """The environment's span for a tool's output."""
    return answer_text(output, "json")


# ---- in the process that loads the taskset (the checker, or the launcher) ----


class ToolSession:
    """One trajectory's tools: fresh toolset objects of `task` (a verifiers Task),
    with one event loop for their async hooks and tools."""

    def __init__(self, task, setup: bool = True):
        from verifiers.v1.utils.decorators import discover_decorated

        self.task = task
        self.loop = asyncio.new_event_loop()
        self.toolsets = list(type(task).toolsets(task.config))
        self.tools: dict[str, tuple[Any, Any]] = {}  # name -> (bound method, arguments model)
        for ts in self.toolsets:
            if setup and type(ts).setup_task is not _base_setup_task():
                self._finish(ts.setup_task(task))
            prefix = ts.server_name
            for fn in discover_decorated(ts, "tool"):
                name = getattr(fn, "tool_name", None) or fn.__name__
                self.tools[f"{prefix}_{name}" if prefix else name] = (fn, _arguments_model(fn))

    def _finish(self, got):
        return self.loop.run_until_complete(got) if inspect.isawaitable(got) else got

    def close(self) -> None:
        self.loop.close()

    def schemas(self) -> list[dict]:
        """The tools as chat APIs list them: name, description, and a JSON schema
        written here from the signature (pydantic's own differs between versions,
        and every node must build the same prompt)."""
        return [{"name": name, "description": inspect.cleandoc(fn.__doc__ or ""),
                 "parameters": _schema(fn)} for name, (fn, _) in self.tools.items()]  # fmt: skip

    def call(self, text: str) -> str:
        """The output of the call written `text` (the JSON between the tags)."""
        from pydantic import ValidationError

        call = read_json_call(text)
        if isinstance(call, str):
            return call
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
            return _as_text(
                self._finish(fn(**{k: getattr(args, k) for k in type(args).model_fields}))
            )
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # recovered: the tool's failure is its answer (SystemExit too)
            # the type only: a message can hold addresses, paths and versions, which
            # differ between nodes, and a validator would take the difference for a forgery
            return f"error: the tool raised {type(e).__name__}"

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


def _parameters(fn) -> list[inspect.Parameter]:
    return [
        p
        for p in inspect.signature(fn, eval_str=True).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _arguments_model(fn):
    """A pydantic model of `fn`'s parameters (lax, as MCP validates them; extra keys
    are ignored)."""
    from pydantic import create_model

    fields = {}
    for p in _parameters(fn):
        annotation = Any if p.annotation is p.empty else p.annotation
        fields[p.name] = (annotation, ... if p.default is p.empty else p.default)
    return create_model(f"{fn.__name__}_arguments", **fields)


_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean",
               list: "array", tuple: "array", dict: "object"}  # fmt: skip


def _schema(fn) -> dict:
    """The JSON schema of `fn`'s arguments: each parameter's JSON type where its
    annotation is a plain one (int, float, str, bool, list, tuple, dict, or one of
    these parametrised), its default, and which are required."""
    import typing

    props, required = {}, []
    for p in _parameters(fn):
        kind = typing.get_origin(p.annotation) or p.annotation
        prop = {"type": _JSON_TYPES[kind]} if kind in _JSON_TYPES else {}
        if p.default is p.empty:
            required.append(p.name)
        elif isinstance(p.default, int | float | str | bool) or p.default is None:
            prop["default"] = p.default
        props[p.name] = prop
    return {"type": "object", "properties": props, "required": required}


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
    try:
        return [session.call(c) for c in calls]
    finally:
        session.close()


def turns_from_replies(task, replies: list[str]) -> tuple[list, Any]:
    """`split_turns` from a trajectory's model spans (the mask says where each ends):
    a span's call is the one at its end; each is run but the last span's, which was
    not answered (the turn limit or the budget ended the trajectory there)."""
    session = ToolSession(task)
    try:
        turns = []
        for k, reply in enumerate(replies):
            m = CALL.search(reply)
            if m is None:
                turns.append((reply, None, None))
                continue
            last = k == len(replies) - 1
            call = m.group(1)
            turns.append((reply[: m.start()], call, None if last else session.call(call)))
        return turns, session.state()
    finally:
        session.close()


def split_turns(task, text: str) -> tuple[list[tuple[str, str | None, str | None]], Any]:
    """A trajectory's text as turns (the model's text, its call, the tool's output),
    replayed on fresh toolsets, and the task's state after them.

    The generation rule read from the text: a span ends at a `</tool_call>` (and the
    blanks after it) that the environment's `<tool_response>` follows, and its call
    starts at the last `<tool_call>` before it. A close tag with more model text after
    it (a token that held both) did not end the span. A call at the very end of the
    text was not answered (the turn limit or the budget ended the trajectory there):
    it is the last turn, with output None, and is not run. So is a call followed by
    an answer its tool does not give."""
    session = ToolSession(task)
    try:
        turns, pos, scan = [], 0, 0
        while True:
            close = text.find(CLOSE, scan)
            if close < 0:
                turns.append((text[pos:], None, None))
                break
            end = close + len(CLOSE)
            gap = len(text) - end - len(text[end:].lstrip())
            start = text.rfind(OPEN, pos, close)
            if start < 0 or (end + gap < len(text) and not text.startswith(RESPONSE, end + gap)):
                scan = end  # not a call that ended a span
                continue
            call = text[start + len(OPEN) : close]
            if end + gap == len(text):
                turns.append((text[pos:start], call, None))
                break
            output = session.call(call)
            answer = response_text(output)
            if not text.startswith(answer, end + gap):
                turns.append((text[pos:start], call, None))
                break
            turns.append((text[pos:start], call, output))
            pos = scan = end + gap + len(answer)
        return turns, session.state()
    finally:
        session.close()


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

    def __init__(self, max_turns: int, timeout_s: float, tool_turns: str = "inline", checker=None):
        from swarmrl.tasks.graders.checker import CheckerProcess

        self.max_turns = max_turns
        # "tool": the model ends its turn after a call, and the answer is a tool turn
        self.turn_role = "tool" if tool_turns == "template" else None
        self.checker = checker or CheckerProcess("swarmrl.tasks.sources.environments", timeout_s)
        self.second: CheckerProcess | None = None  # a second opinion (`BoundTools.doubt`)

    def ends(self, model_span: str) -> bool:
        return not self.turn_role and call_at_end(model_span) is not None

    def answer(self, output: str) -> str:
        """The environment's span for an output: `<tool_response>...</tool_response>`
        inline, or the output itself as a tool turn's content."""
        return answer_content(output) if self.turn_role else response_text(output)

    def second_checker(self):
        """Another checker process than the one that answers, for a second opinion:
        started at the first doubt and kept (a fresh one per doubt costs a process
        start per row of a file, which a forger could make a validator pay)."""
        return second_checker(self)

    def bind(self, task) -> BoundTools:
        info = task.verification_info
        self.checker.warm(["load", info["env"], info["args"]])  # loading is not a call's time
        return BoundTools(self, info)

    def outputs(self, info: dict, calls: list[str], checker=None) -> list[str] | str:
        """The outputs of `calls` in order on fresh toolsets of the row, or, when
        there are none, why: TIME_LIMIT (they took longer than the limit) or DIED.
        `checker`: another process than the environment's own."""
        checker = checker or self.checker
        got = checker.call(["tools", info, calls])
        if got is None:
            return DIED if checker.crashed else TIME_LIMIT
        if not isinstance(got, list) or len(got) != len(calls):
            return DIED  # not an answer of ours: the child is not to be trusted
        return got


class BoundTools:
    """The tools of one trajectory: answers a call from the calls before it."""

    def __init__(self, env: VerifiersEnvironment, info: dict):
        self.env, self.info = env, info
        self.turn_role = env.turn_role
        self.calls: list[str] = []  # the call of each model span so far, by turn
        self.failed: dict[int, str] = {}  # turns whose tools gave no output, and why

    def ends(self, model_span: str) -> bool:
        return self.env.ends(model_span)

    @property
    def failure_answers(self) -> tuple[str, ...]:
        """The answers that say the tools gave none (replay reads a file's span as one
        of these only when its tokens are exactly that answer's)."""
        return (self.env.answer(TIME_LIMIT), self.env.answer(DIED))

    def respond(self, model_span: str, turn: int) -> str | None:
        """The environment's span after model span `turn` (0-based), or None when the
        trajectory ends there (no call, or the turn limit)."""
        call = call_at_end(model_span)
        if call is None or turn + 1 >= self.env.max_turns:
            return None
        self.calls = self.calls[:turn] + [call]
        got = self.env.outputs(self.info, self.calls)
        self.failed.pop(turn, None)
        if isinstance(got, str):
            self.failed[turn] = got
            return self.env.answer(got)
        return self.env.answer(got[-1])

    def doubt(self, model_span: str, turn: int, answer: str, claimed: str) -> str | None:
        """Why the file's span `claimed` may differ from `answer` through no fault of
        the worker: the tools ran out of time or their process died, here (known out
        of band, not from the text) or on the worker (its text says so), or they
        answer differently on a second run in another process."""
        if turn in self.failed or claimed in self.failure_answers:
            return (
                "the taskset's tools ran out of time or their process died (on the worker or here)"
            )
        call = call_at_end(model_span)
        again = self.env.outputs(self.info, [*self.calls[:turn], call], self.env.second_checker())
        if isinstance(again, str) or self.env.answer(again[-1]) != answer:
            return "the taskset's tools answer differently on a second run"
        return None


def second_checker(env):
    """`env.second`, started with the warm-ups of `env.checker` on first use."""
    from swarmrl.tasks.graders.checker import CheckerProcess

    if env.second is None:
        env.second = CheckerProcess(env.checker.module, env.checker.timeout_s)
    for request in env.checker.warmups:
        env.second.warm(request)
    return env.second


def check_deterministic(env: VerifiersEnvironment, info: dict, schemas: list[dict]) -> None:
    """Refuse tools whose answers to the same probe calls differ: run twice in one
    checker process (state a call leaves behind, in a module or class, shows) and once
    in a fresh one (what differs between processes shows)."""
    from swarmrl.errors import ConfigError

    probes = probe_calls(schemas)
    runs = [env.outputs(info, probes), env.outputs(info, probes)]
    env.checker.close()
    runs.append(env.outputs(info, probes))
    for got in runs:
        if isinstance(got, str):
            raise ConfigError(
                f"the taskset's tools gave no answer to the probe calls {probes} ({got}; "
                f"env.tool_timeout_s is {env.checker.timeout_s} s)"
            )
    for k, probe in enumerate(probes):
        answers = [got[k] for got in runs]
        if len(set(answers)) > 1:
            where = "in one process" if answers[0] != answers[1] else "in a fresh process"
            raise ConfigError(
                f"the taskset's tools are not deterministic: {probe} was answered "
                f"{answers[0]!r} and then {answers[1] if answers[0] != answers[1] else answers[2]!r} "
                f"{where}; a validator could not recompute their answers"
            )
