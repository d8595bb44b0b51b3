"""Tasks and rewards from PrimeIntellect `verifiers` environments (v1 API).

`task.name = "verifiers"`, `task.env = "<taskset id>"`, `task.env_args = {...}`:
the installed taskset (a package or module whose `__all__` exports one
`verifiers.v1.Taskset` subclass, found by its id as `verifiers` itself does:
`owner/` and `@version` dropped, `-` read as `_`) is loaded with `env_args` as
its config, and its rows become the run's problems, like the records of a task
file: row i is problem i, wrapped modulo the row count, the same for both
splits. Every node must run the same taskset, verifiers and pydantic: the
orchestrator serves its `fingerprint` as `task.env_fingerprint`, and a node
whose own differs refuses to build the run's tasks (`check_fingerprint`).

Prompt: the row's system prompt (if any) and its user prompt, joined by a
blank line into the one user turn swarmrl sends. Reward: the taskset's own
`@vf.reward` functions, scored offline on a `Trace` holding the prompt and the
completion as the one sampled assistant message; the reward is the taskset's
weighted sum (`trace.reward`), not clipped to [0, 1]. Scoring runs in a checker
process (tasks/graders/checker.py) that loads the taskset once and is bounded by
`TIMEOUT_S` per completion, so a reward function that hangs on a hostile
completion costs that long and scores 0.

Supported: tasksets whose rewards need only the trace, single-turn, with
tools the model calls (`[env] kind = "verifiers"`, envs/verifiers_tools.py: the
prompt then lists the tools before the question, and the trace holds the tool
turns and the tools' state), or with their own multi-turn `Env` played by one
seat (the same kind, envs/verifiers_episodes.py: the reward is the episode's,
played on the trajectory's model spans). Refused with an error that says why (a
run cannot grade them faithfully offline): a `Harness` (an agent program), an
`Env` with more seats or its own setup, finalize, start or stop
(`episode_problems`), toolsets that cannot run in-process per
trajectory (`tool_problems`), containers or sandboxes, setup/finalize steps,
stop or intercept hooks, rewards that need a runtime, LLM judges (they call a
hosted service), infinite tasksets, and prompts that already hold assistant or
tool turns. Nothing here calls a model or a hosted service; a taskset's own
`load()` or reward code is the user's, and may.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json

from swarmrl.config import TaskConfig
from swarmrl.tasks.graders.checker import CheckerProcess, serve
from swarmrl.tasks.schema import Task, TaskError

TIMEOUT_S = 10.0
MAX_ROWS = 1_000_000


def _import():
    try:
        import verifiers
        import verifiers.v1 as vf
    except ImportError:
        raise TaskError(
            "task.name = 'verifiers' needs the verifiers package: pip install 'swarmrl[tasks]'"
        ) from None
    return verifiers, vf


@functools.lru_cache(maxsize=8)
def _load(env: str, args_json: str) -> list:
    """The taskset's rows (verifiers Task objects), checked single-turn."""
    _, vf = _import()
    try:
        module = vf.import_taskset(env)
        config_type = vf.taskset_config_type(env)
    except Exception as e:
        raise TaskError(f"task.env '{env}': cannot load the taskset: {e}") from None
    try:
        config = config_type.model_validate({**json.loads(args_json), "id": env})
    except Exception as e:
        raise TaskError(f"task.env_args for '{env}': {e}") from None
    taskset = vf.load_taskset(config)
    if taskset.INFINITE:
        raise TaskError(f"task.env '{env}': infinite tasksets are not supported yet")
    rows = []
    for task in taskset:
        rows.append(task)
        if len(rows) > MAX_ROWS:
            raise TaskError(f"task.env '{env}': more than {MAX_ROWS} rows")
    if not rows:
        raise TaskError(f"task.env '{env}': the taskset has no rows")
    why = unsupported(vf, module, env, taskset, rows[0])
    for task in rows:
        why += [w for w in _row_problems(task) if w not in why]
    if why:
        raise TaskError(
            f"task.env '{env}' is not a taskset swarmrl can grade offline: " + "; ".join(why)
        )
    return rows


def unsupported(vf, module, env: str, taskset, task) -> list[str]:
    """What makes a taskset more than single-turn chat with trace-only rewards."""
    from verifiers.v1.envs.single_agent import SingleAgentEnv
    from verifiers.v1.harness import Harness

    why = []
    env_class = vf.environment_class(env)
    if env_class is not SingleAgentEnv:
        why += episode_problems(vf, env_class, task)
    if any(
        inspect.isclass(getattr(module, n, None)) and issubclass(getattr(module, n), Harness)
        for n in getattr(module, "__all__", [])
    ):
        why.append("it has its own harness (an agent program)")
    if type(taskset).toolsets(taskset.config):
        why.append("it has tools shared by the whole taskset (one server for every rollout)")
    why += tool_problems(vf, task)
    if type(task).NEEDS_CONTAINER:
        why.append("it needs a container")
    for hook in ("setup", "finalize", "stage_verifier"):
        if getattr(type(task), hook, None) is not getattr(vf.Task, hook, None):
            why.append(f"it overrides Task.{hook}")
    if task.hooks("stop"):
        why.append("it has stop hooks (multi-turn)")
    for fn in task.hooks("reward") + task.hooks("metric"):
        p = inspect.signature(fn).parameters.get("runtime")
        if p is not None and p.default is inspect.Parameter.empty:
            why.append(f"reward {fn.__name__} needs a runtime")
    if task.config.judges:
        why.append("it uses LLM judges (a hosted service)")
    if not task.hooks("reward") and env_class is SingleAgentEnv:
        why.append("it defines no reward")  # an environment records its own
    return why


def episode_problems(vf, env_class, task) -> list[str]:
    """What keeps a taskset's own `Env` from being played offline with one scripted
    seat (envs/verifiers_episodes.py)."""
    from swarmrl.envs.verifiers_episodes import seat_name

    name = env_class.__name__
    why = []
    if not seat_name(env_class):
        why.append(
            f"its environment {name} does not have exactly one seat with a default "
            "AgentConfig (agents playing each other are not supported)"
        )
    for hook in ("setup", "finalize", "start", "stop"):
        if getattr(env_class, hook) is not getattr(vf.Env, hook):
            why.append(f"its environment {name} overrides Env.{hook}")
    if type(task).toolsets(task.config):
        why.append(f"its environment {name} and its tools together (one or the other is built)")
    return why


def tool_problems(vf, task) -> list[str]:
    """What keeps a task's toolsets from running in-process, offline, per trajectory
    (envs/verifiers_tools.py)."""
    from verifiers.v1.runtimes import SubprocessConfig

    toolsets = type(task).toolsets(task.config)
    again = type(task).toolsets(task.config)
    why = [
        f"its toolset {type(ts).__name__} is the same object on every call of toolsets() "
        "(a trajectory's tools must start fresh, or their state leaks into the next)"
        for ts in toolsets
        if any(ts is other for other in again)
    ]
    for ts in toolsets:
        name = type(ts).__name__
        if not isinstance(ts, vf.Toolset):
            why.append(f"its tool server {name} is not a vf.Toolset of @vf.tool methods")
            continue
        for hook in ("setup", "register"):
            if getattr(type(ts), hook) is not getattr(vf.Toolset, hook):
                why.append(f"its toolset {name} overrides {hook}()")
        cfg = ts.config
        if getattr(cfg, "url", None):
            why.append(f"its toolset {name} is a remote server ({cfg.url})")
        if not isinstance(getattr(cfg, "runtime", SubprocessConfig()), SubprocessConfig):
            why.append(f"its toolset {name} runs in a {type(cfg.runtime).__name__} runtime")
    return why


def task_row(info: dict):
    """The verifiers Task of a swarmrl task's `verification_info`."""
    return _load(info["env"], json.dumps(info["args"], sort_keys=True))[info["row"]]


def has_tools(env: str, args: dict) -> bool:
    """Whether the taskset's tasks have tools (`[env] kind = "verifiers"` runs them)."""
    task = _load(env, json.dumps(args, sort_keys=True))[0]
    return bool(type(task).toolsets(task.config))


def has_episodes(env: str, args: dict) -> bool:
    """Whether the taskset has its own multi-turn `Env` (`[env] kind = "verifiers"`
    plays it)."""
    from verifiers.v1.envs.single_agent import SingleAgentEnv

    _, vf = _import()
    _load(env, json.dumps(args, sort_keys=True))  # checked
    return vf.environment_class(env) is not SingleAgentEnv


_TOOL_PROMPTS: dict[tuple[type, str], str] = {}


def _tool_prompt(task) -> str:
    """The prompt's list of the task's tools (the same for every task of its class
    and config)."""
    from swarmrl.envs.verifiers_tools import ToolSession, tool_prompt

    key = (type(task), task.config.model_dump_json())
    if key not in _TOOL_PROMPTS:
        _TOOL_PROMPTS[key] = tool_prompt(ToolSession(task, setup=False).schemas())
    return _TOOL_PROMPTS[key]


def _row_problems(task) -> list[str]:
    d = task.data
    why = []
    if d.image:
        why.append("a row needs a container image")
    if d.prompt is None:
        why.append("a row has no prompt")
    elif not isinstance(d.prompt, str) and any(m.role in ("assistant", "tool") for m in d.prompt):
        why.append("a prompt already holds assistant or tool turns")
    return why


def _messages(task) -> list[tuple[str, str]]:
    d = task.data
    out = [("system", d.system_prompt)] if d.system_prompt else []
    if isinstance(d.prompt, str):
        out.append(("user", d.prompt))
    else:
        for m in d.prompt:
            content = (
                m.content if isinstance(m.content, str) else json.dumps(m.model_dump()["content"])
            )
            out.append((m.role, content))
    return out


@functools.lru_cache(maxsize=8)
def fingerprint(env: str, args_json: str = "{}") -> str:
    """What the taskset's prompts, tool answers and rewards come from: the verifiers
    and pydantic versions, a hash of the taskset's code (every .py file of its package,
    or its one module: a single-module taskset's helper modules are not covered), and a
    hash of the rows it loads with these arguments."""
    from pathlib import Path

    import pydantic

    verifiers, vf = _import()
    try:
        module = vf.import_taskset(env)
    except Exception as e:
        raise TaskError(f"task.env '{env}': cannot load the taskset: {e}") from None
    if getattr(module, "__file__", None) and Path(module.__file__).name != "__init__.py":
        roots, files = [Path(module.__file__).parent], [Path(module.__file__)]
    else:  # a package, or a namespace package (no __file__)
        roots = sorted(Path(p) for p in getattr(module, "__path__", []))
        files = sorted(f for r in roots for f in r.rglob("*.py") if "__pycache__" not in f.parts)
    code = hashlib.sha256()
    for f in files:
        rel = next(str(f.relative_to(r)) for r in roots if f.is_relative_to(r))
        code.update(f"{rel}\0{f.stat().st_size}\0".encode())
        code.update(f.read_bytes())
    rows = hashlib.sha256()
    for task in _load(env, args_json):
        rows.update(task.data.model_dump_json().encode() + b"\0")
    return (
        f"verifiers {verifiers.__version__}, pydantic {pydantic.VERSION}, "
        f"taskset {code.hexdigest()[:16]}, rows {rows.hexdigest()[:16]}"
    )


def check_fingerprint(cfg: TaskConfig) -> None:
    """Refuse to build a run's tasks from another taskset or library version than the
    run's (`task.env_fingerprint`, when set)."""
    if cfg.name != "verifiers" or not cfg.env_fingerprint:
        return
    mine = fingerprint(cfg.env, json.dumps(cfg.env_args, sort_keys=True))
    if mine != cfg.env_fingerprint:
        raise TaskError(
            f"this run's taskset '{cfg.env}' is {cfg.env_fingerprint} (task.env_fingerprint) "
            f"and this node has {mine}: its prompts, tool answers and rewards could differ "
            "from the other nodes', which a validator would take for a cheat; install the "
            "run's versions of the taskset, verifiers and pydantic, and the data its rows "
            "are loaded from"
        )


def records(cfg: TaskConfig) -> list[Task]:
    """The taskset's rows as swarmrl tasks (checked when the task source is built)."""
    check_fingerprint(cfg)
    args = json.dumps(cfg.env_args, sort_keys=True)
    rows = _load(cfg.env, args)
    out = []
    for i, task in enumerate(rows):
        parts = [text for _, text in _messages(task)]
        if type(task).toolsets(task.config):  # the tools and how to call them, before the question
            parts.insert(len(parts) - 1, _tool_prompt(task))
        prompt = "\n\n".join(parts)
        rid = task.data.id or str(i)
        out.append(
            Task(
                problem_id=f"{cfg.env}/{rid}"[:256],
                prompt=prompt,
                task_type="verifiers",
                verification_info={"env": cfg.env, "args": cfg.env_args, "row": i},
                metadata={"env": cfg.env},
            )
        )
    return out


def _trace(verifiers, vf, task, completion: str, spans: list[str] | None = None):
    """The trace the taskset's rewards read: the prompt's messages, then the
    completion as one assistant message, or, for a task with tools, its turns (each
    call an assistant message with `tool_calls`, its output a tool message) and the
    tools' state after them: from the model's `spans` where given, else read from the
    text by the generation rule."""
    from verifiers.v1.state import state_cls

    from swarmrl.envs.verifiers_tools import split_turns, turns_from_replies

    replies: list = [vf.AssistantMessage(content=completion)]
    state = state_cls(type(task))()
    if type(task).toolsets(task.config):
        if spans is not None:
            turns, state = turns_from_replies(task, spans)
        else:
            turns, state = split_turns(task, completion)
        replies = []
        for k, (text, call, output) in enumerate(turns):
            calls = None
            if call is not None:
                parsed = _call_parts(call)
                calls = [vf.ToolCall(id=f"call_{k}", name=parsed[0], arguments=parsed[1])]
            replies.append(vf.AssistantMessage(content=text, tool_calls=calls))
            if output is not None:
                replies.append(vf.ToolMessage(tool_call_id=f"call_{k}", content=output))
    trace = empty_trace(task, state)
    parent = len(trace.nodes) - 1
    for reply in replies:
        sampled = reply.role == "assistant"
        trace.nodes.append(vf.MessageNode(parent=parent, message=reply, sampled=sampled))
        parent = len(trace.nodes) - 1
    trace.stop("agent_completed")
    trace.ok = True
    return trace


def empty_trace(task, state=None):
    """A trace of `task` holding its prompt's messages (`state`: the task's state)."""
    from verifiers.v1.state import state_cls

    verifiers, vf = _import()
    trace = vf.Trace(
        verifiers=vf.VersionInfo(version=verifiers.__version__),
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig(), name="swarmrl", trainable=False),
        state=state if state is not None else state_cls(type(task))(),
    )
    parent = None
    kinds = {"system": vf.SystemMessage, "user": vf.UserMessage}
    for role, text in _messages(task):
        trace.nodes.append(vf.MessageNode(parent=parent, message=kinds[role](content=text)))
        parent = len(trace.nodes) - 1
    return trace


def _call_parts(call: str) -> tuple[str, str]:
    """(name, arguments as JSON) of a call's text, as a chat API's tool_calls hold them
    (a malformed call keeps its text as the arguments)."""
    try:
        got = json.loads(call)
        return str(got["name"]), json.dumps(got.get("arguments", {}), sort_keys=True)
    except (ValueError, KeyError, TypeError, AttributeError):
        return "", call


def _score(request: list) -> float | bool | list[str]:
    if request[0] == "load":  # a warm-up: load the taskset before the first timed score
        _load(request[1], json.dumps(request[2], sort_keys=True))
        return True
    if request[0] == "tools":  # the outputs of a trajectory's calls (envs/verifiers_tools.py)
        from swarmrl.envs.verifiers_tools import run_calls

        try:
            return run_calls(task_row(request[1]), request[2])
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # recovered: toolsets that cannot start answer every call so
            return [f"error: the tools could not start: {type(e).__name__}"] * len(request[2])
    if request[0] in ("episode", "episode_score"):  # a taskset's own Env: its next turn,
        from swarmrl.envs import verifiers_episodes as episodes  # or the reward

        info = request[1]
        env = episodes.environment(info["env"], json.dumps(info["args"], sort_keys=True))
        play = episodes.next_turn if request[0] == "episode" else episodes.score
        return play(env, task_row(info), empty_trace, request[2], request[3])
    info, completion, *spans = request  # spans: the model's, of a trajectory
    verifiers, vf = _import()
    task = _load(info["env"], json.dumps(info["args"], sort_keys=True))[info["row"]]
    trace = _trace(verifiers, vf, task, completion, spans[0] if spans else None)
    try:
        asyncio.run(task.score(trace))
    except Exception:  # recovered: a reward that fails on this completion grades it 0
        return 0.0
    if any(r is None for r in trace.rewards.values()):
        return 0.0
    reward = float(trace.reward)
    return reward if reward == reward and abs(reward) != float("inf") else 0.0


def _has_episodes(info: dict) -> bool:
    return has_episodes(info["env"], info["args"])


class EnvChecker(CheckerProcess):
    def __init__(self, timeout_s: float = TIMEOUT_S):
        super().__init__("swarmrl.tasks.sources.environments", timeout_s)


_checker = EnvChecker()


_MAX_TURNS = [1]  # the run's env.max_turns: an episode's turns after the last reply


def set_episode_turns(max_turns: int) -> None:
    """The run's turn limit, which tells an episode's rewards why it ended after the
    last reply: the turn limit, or else the token budget (`trace.stop_condition`)."""
    _MAX_TURNS[0] = max_turns


def set_score_timeout(seconds: float) -> None:
    """The time limit of one score in this process: a taskset with tools replays the
    trajectory's calls (`[env] kind = "verifiers"`: TIMEOUT_S plus each turn's
    `env.tool_timeout_s`)."""
    _checker.timeout_s = seconds


def score_env(
    info: dict, completion: str, replies: list[str] | None = None, checker: EnvChecker | None = None
) -> float:
    """The taskset's reward for the completion (0 after a timeout). `replies`: the
    model's spans of a trajectory, which a taskset's own environment plays."""
    checker = checker or _checker
    checker.warm(["load", info["env"], info["args"]])
    if _has_episodes(info):  # a single completion (eval, filter, warm start) is one reply
        got = checker.call(["episode_score", info, replies or [completion], _MAX_TURNS[0]])
    elif replies is None:
        got = checker.call([info, completion])
    else:
        got = checker.call([info, completion, replies])
    return 0.0 if got is None else float(got)


if __name__ == "__main__":
    _import()
    serve(_score)
