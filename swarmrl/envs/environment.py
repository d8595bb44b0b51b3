"""The environment of a trajectory: what it inserts between the model's spans.

A trajectory alternates the model's spans and the environment's: the model
writes until it ends its span (end of sequence, or a tool call at the end of
its text: envs/tools.py), the environment answers (`respond`), the model goes
on from there, until the model ends without a call or the turn limit is
reached. The environment must be a pure function of the task and the model's
spans so far: a validator recomputes every environment span from the model's
spans and rejects a trajectory in which one differs (`replay`).

`check_deterministic` runs an environment twice on the same probes and
refuses it, naming the probe, when the two answers differ: a run starts only
with an environment a validator can recompute. The Python tool is
deterministic for most programs, not all (envs/python_tool.py): where a
validator's own answer cannot settle a difference, `doubt` says why, and the
file is refused without blame (check `unverifiable`).

`from_config` builds the run's environment from `[env]`: workers generate with
it and validators replay with it, with the same tools, call form and limits.
"""

from __future__ import annotations

from swarmrl.envs.python_tool import TIME_LIMIT, PythonLimits, check_interpreter
from swarmrl.envs.tools import (
    ARGUMENT,
    SYNTAXES,
    TOOLS,
    CalcLimits,
    answer_content,
    answer_text,
    call_at_end,
    run_tool,
)
from swarmrl.errors import ConfigError


class ToolEnvironment:
    """Answers the tool call that ends a model span; ends the trajectory on a span
    without one, or when `max_turns` model spans have been written."""

    def __init__(
        self,
        tools: tuple[str, ...] = TOOLS,
        max_turns: int = 4,
        syntax: str = "tag",
        limits: CalcLimits | None = None,
        python: PythonLimits | None = None,
        tool_turns: str = "inline",
    ):
        unknown = [t for t in tools if t not in TOOLS]
        if unknown:
            raise ConfigError(f"unknown tools {unknown}; the tools built are {list(TOOLS)}")
        if max_turns < 1:
            raise ConfigError("max_turns must be at least 1")
        if syntax not in SYNTAXES:
            raise ConfigError(f"unknown call syntax {syntax!r}; one of {list(SYNTAXES)}")
        if "python" in tools and (python or PythonLimits()).isolation == "auto":
            raise ConfigError(
                "the python tool needs one sandbox isolation on every node: set "
                "env.python_isolation to 'namespace' (where unshare works) or 'process' "
                "(a program sees its PID, user and paths, which differ between the two)"
            )
        if syntax == "equals" and "python" in tools:
            raise ConfigError(
                "the python tool is called with the tag form (<python>...</python>) or the "
                "json form: set env.syntax = 'tag' or 'json', or offer only calc"
            )
        if tool_turns == "template" and syntax != "json":
            raise ConfigError(
                "env.tool_turns = 'template' answers calls of the json form in a tool turn "
                "of the chat template: set env.syntax = 'json'"
            )
        self.tools = tuple(tools)
        # "tool": the model ends its turn after a call, and the answer is a tool turn
        self.turn_role = "tool" if tool_turns == "template" else None
        self.max_turns = max_turns
        self.syntax = syntax
        self.limits = limits or CalcLimits()
        self.python = python or PythonLimits()

    def ends(self, model_span: str) -> bool:
        """Whether the model's span so far ends here (a tool call closes it; in tool
        turns, only the end-of-turn token does)."""
        return not self.turn_role and call_at_end(model_span, self.syntax) is not None

    def _answer(self, output: str) -> str:
        """The environment's span for a tool's output: in the call's form, or, in tool
        turns, the output itself (the chat template wraps it)."""
        return answer_content(output) if self.turn_role else answer_text(output, self.syntax)

    def respond(self, model_span: str, turn: int) -> str | None:
        """The environment's span after model span number `turn` (0-based), or None
        when the trajectory ends there."""
        call = call_at_end(model_span, self.syntax)
        if call is None or turn + 1 >= self.max_turns:
            return None
        if not call.tool:  # a json call that cannot be read: why
            return self._answer(call.argument)
        if call.tool not in self.tools:
            return self._answer(f"error: the tool {call.tool!r} is not offered here")
        return self._answer(run_tool(call, self.limits, self.python))

    @property
    def failure_answers(self) -> tuple[str, ...]:
        """The answers that say the tool gave none (replay reads a file's span as one of
        these only when its tokens are exactly that answer's)."""
        return (self._answer(TIME_LIMIT),) if "python" in self.tools else ()

    def doubt(self, model_span: str, turn: int, answer: str, claimed: str) -> str | None:
        """Why the file's environment span `claimed` may differ from this environment's
        `answer` through no fault of the worker (None: the difference is the worker's).
        Only a Python program can: one that ran into the time limit on either side
        (machines differ in speed), or one whose output differs between two runs here."""
        call = call_at_end(model_span, self.syntax)
        if call is None or call.tool != "python" or call.tool not in self.tools:
            return None
        limit = self._answer(TIME_LIMIT)
        if answer == limit or claimed == limit:  # exactly: a forged answer may quote it
            return "the program ran into the time limit (on the worker or here)"
        if self.respond(model_span, turn) != answer:
            return "the program's output differs between two runs (it reads what the sandbox does not fix)"
        return None


def from_config(env_cfg, task_cfg=None):
    """The run's environment (`[env]`), checked for determinism; None: single turn.
    `task_cfg` ([task]): a verifiers taskset's tools need `kind = "verifiers"`, and that
    kind needs such a taskset."""
    tools = episodes = False
    if task_cfg is not None and task_cfg.name == "verifiers":
        tools, episodes = _taskset_kind(task_cfg)
    if (tools or episodes) and env_cfg.kind != "verifiers":
        what = "gives its tasks tools" if tools else "has its own multi-turn environment"
        raise ConfigError(
            f"task.env '{task_cfg.env}' {what}: set [env] kind = 'verifiers' so that "
            "the model can play it and validators can check its turns"
        )
    if env_cfg.kind == "verifiers":
        if episodes:
            return _verifiers_episodes(env_cfg, task_cfg)
        if not tools:
            raise ConfigError(
                "env.kind = 'verifiers' runs a verifiers taskset's tools or its own "
                "environment: set task.name = 'verifiers' and task.env to a taskset whose "
                "tasks have tools or whose package exports a vf.Env"
            )
        return _verifiers_environment(env_cfg, task_cfg)
    if env_cfg.kind == "none":
        return None
    if "python" in env_cfg.tools:
        check_interpreter(env_cfg.python_version)
    env = ToolEnvironment(
        tuple(env_cfg.tools),
        env_cfg.max_turns,
        env_cfg.syntax,
        CalcLimits(env_cfg.max_expr_chars, env_cfg.max_digits, env_cfg.max_exponent),
        PythonLimits(env_cfg.python_cpu_s, env_cfg.python_memory_mb, env_cfg.python_isolation),
        env_cfg.tool_turns,
    )
    check_deterministic(env)
    return env


def _taskset_kind(task_cfg) -> tuple[bool, bool]:
    """(whether the taskset's tasks have tools, whether it has its own `Env`)."""
    from swarmrl.tasks.schema import TaskError
    from swarmrl.tasks.sources.environments import has_episodes, has_tools

    try:
        return has_tools(task_cfg.env, task_cfg.env_args), has_episodes(
            task_cfg.env, task_cfg.env_args
        )
    except TaskError as e:
        raise ConfigError(str(e)) from None


def _verifiers_episodes(env_cfg, task_cfg):
    """The taskset's own environment, probed on its first row."""
    from swarmrl.envs.verifiers_episodes import EpisodeEnvironment, check_deterministic
    from swarmrl.tasks.sources.environments import records

    if env_cfg.max_turns < 2:
        raise ConfigError("a multi-turn environment needs env.max_turns of at least 2")
    env = EpisodeEnvironment(env_cfg.max_turns, env_cfg.tool_timeout_s)
    first = records(task_cfg)[0]
    env.bind(first)  # loads the taskset in the checker before the timed probes
    check_deterministic(env, first.verification_info)
    return env


def _verifiers_environment(env_cfg, task_cfg):
    """The taskset's tools, probed twice on its first row."""
    from swarmrl.envs.verifiers_tools import (
        ToolSession,
        VerifiersEnvironment,
        check_deterministic,
    )
    from swarmrl.tasks.sources.environments import records, task_row

    env = VerifiersEnvironment(env_cfg.max_turns, env_cfg.tool_timeout_s, env_cfg.tool_turns)
    first = records(task_cfg)[0]
    env.bind(first)  # loads the taskset in the checker before the timed probes
    schemas = ToolSession(task_row(first.verification_info), setup=False).schemas()
    check_deterministic(env, first.verification_info, schemas)
    return env


_BUILT: dict = {}


def built_key(cfg) -> str:
    """What `environment_of` builds one environment per."""
    return cfg.env.model_dump_json() + cfg.task.model_dump_json()


def environment_of(cfg):
    """`from_config(cfg.env, cfg.task)`, built and checked once per distinct `[env]`
    and `[task]`."""
    key = built_key(cfg)
    if key not in _BUILT:
        _BUILT[key] = from_config(cfg.env, cfg.task)
    return _BUILT[key]


def bound(env, tasks) -> list:
    """The environment of each trajectory: `env.bind(task)` where the environment
    answers from its task (a verifiers taskset's tools), else `env` itself."""
    bind = getattr(env, "bind", None)
    return [bind(t) if bind else env for t in tasks]


# calls every tool environment is probed with before a run, written in the run's form
# (the answers must repeat), and spans that are no call or a malformed one
PROBE_CALLS = (
    ("calc", "4821 * 377"),
    ("calc", "(12 + 7) / 3"),
    ("calc", "2 ** 300"),
    ("calc", "1 / 0"),
    ("calc", "__import__('os')"),
    ("python", "import random, time\nprint(set('abcdefgh'), random.random(), time.time())"),
    ("python", "print(1 / 0)"),
)
PROBE_SPANS = ("The answer is 42.", "47 * 382 =", "(12 + 7) / 0 =", "<tool_call>{nope</tool_call>")


def probes_for(syntax: str) -> tuple[str, ...]:
    """The probes written in the call form `syntax`."""
    import json

    if syntax == "json":
        calls = [
            "<tool_call>" + json.dumps({"name": t, "arguments": {ARGUMENT[t]: a}}) + "</tool_call>"
            for t, a in PROBE_CALLS
        ]
    elif syntax == "tag":
        calls = [f"<{t}>{a}</{t}>" for t, a in PROBE_CALLS]
    else:  # equals: the arithmetic spans below
        calls = []
    return (*calls, *PROBE_SPANS)


def check_deterministic(env, probes: tuple[str, ...] | None = None, runs: int = 2) -> None:
    """Refuse an environment whose answers to the same spans differ between runs (the
    probes: `probes_for` the environment's call form)."""
    for probe in probes or probes_for(getattr(env, "syntax", "tag")):
        answers = {env.respond(probe, 0) for _ in range(runs)}
        if len(answers) > 1:
            raise ConfigError(
                f"the environment is not deterministic: {probe!r} was answered "
                f"{sorted(map(repr, answers))}; a validator could not recompute its spans"
            )
