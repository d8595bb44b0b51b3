"""Tasks and rewards from PrimeIntellect `verifiers` environments (v1 API).

`task.name = "verifiers"`, `task.env = "<taskset id>"`, `task.env_args = {...}`:
the installed taskset (a package or module whose `__all__` exports one
`verifiers.v1.Taskset` subclass, found by its id as `verifiers` itself does:
`owner/` and `@version` dropped, `-` read as `_`) is loaded with `env_args` as
its config, and its rows become the run's problems, like the records of a task
file: row i is problem i, wrapped modulo the row count, the same for both
splits.

Prompt: the row's system prompt (if any) and its user prompt, joined by a
blank line into the one user turn swarmrl sends. Reward: the taskset's own
`@vf.reward` functions, scored offline on a `Trace` holding the prompt and the
completion as the one sampled assistant message; the reward is the taskset's
weighted sum (`trace.reward`), not clipped to [0, 1]. Scoring runs in a checker
process (tasks/graders/checker.py) that loads the taskset once and is bounded by
`TIMEOUT_S` per completion, so a reward function that hangs on a hostile
completion costs that long and scores 0.

Supported: single-turn tasksets whose rewards need only the trace. Refused with
an error that says why (a run cannot grade them faithfully offline):
environments with their own `Env` or `Harness` (multi-turn or agentic
episodes), tool sets, containers or sandboxes, setup/finalize steps, stop or
intercept hooks, rewards that need a runtime, LLM judges (they call a hosted
service), infinite tasksets, and prompts that already hold assistant or tool
turns. Nothing here calls a model or a hosted service; a taskset's own
`load()` or reward code is the user's, and may.
"""

from __future__ import annotations

import asyncio
import functools
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
            f"task.env '{env}' is not a single-turn taskset swarmrl can grade offline: "
            + "; ".join(why)
        )
    return rows


def unsupported(vf, module, env: str, taskset, task) -> list[str]:
    """What makes a taskset more than single-turn chat with trace-only rewards."""
    from verifiers.v1.envs.single_agent import SingleAgentEnv
    from verifiers.v1.harness import Harness

    why = []
    env_class = vf.environment_class(env)
    if env_class is not SingleAgentEnv:
        why.append(f"it has its own environment {env_class.__name__} (multi-turn episodes)")
    if any(
        inspect.isclass(getattr(module, n, None)) and issubclass(getattr(module, n), Harness)
        for n in getattr(module, "__all__", [])
    ):
        why.append("it has its own harness (an agent program)")
    if type(taskset).toolsets(taskset.config) or type(task).toolsets(task.config):
        why.append("it uses tools")
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
    if not task.hooks("reward"):
        why.append("it defines no reward")
    return why


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


def records(cfg: TaskConfig) -> list[Task]:
    """The taskset's rows as swarmrl tasks (checked when the task source is built)."""
    args = json.dumps(cfg.env_args, sort_keys=True)
    rows = _load(cfg.env, args)
    out = []
    for i, task in enumerate(rows):
        prompt = "\n\n".join(text for _, text in _messages(task))
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


def _trace(verifiers, vf, task, completion: str):
    from verifiers.v1.state import state_cls

    trace = vf.Trace(
        verifiers=vf.VersionInfo(version=verifiers.__version__),
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig(), name="swarmrl", trainable=False),
        state=state_cls(type(task))(),
    )
    parent = None
    kinds = {"system": vf.SystemMessage, "user": vf.UserMessage}
    for role, text in _messages(task):
        trace.nodes.append(vf.MessageNode(parent=parent, message=kinds[role](content=text)))
        parent = len(trace.nodes) - 1
    reply = vf.AssistantMessage(content=completion)
    trace.nodes.append(vf.MessageNode(parent=parent, message=reply, sampled=True))
    trace.stop("agent_completed")
    trace.ok = True
    return trace


def _score(request: list) -> float | bool:
    if request[0] == "load":  # a warm-up: load the taskset before the first timed score
        _load(request[1], json.dumps(request[2], sort_keys=True))
        return True
    info, completion = request
    verifiers, vf = _import()
    task = _load(info["env"], json.dumps(info["args"], sort_keys=True))[info["row"]]
    trace = _trace(verifiers, vf, task, completion)
    try:
        asyncio.run(task.score(trace))
    except Exception:  # recovered: a reward that fails on this completion grades it 0
        return 0.0
    if any(r is None for r in trace.rewards.values()):
        return 0.0
    reward = float(trace.reward)
    return reward if reward == reward and abs(reward) != float("inf") else 0.0


class EnvChecker(CheckerProcess):
    def __init__(self, timeout_s: float = TIMEOUT_S):
        super().__init__("swarmrl.tasks.sources.environments", timeout_s)


_checker = EnvChecker()


def score_env(info: dict, completion: str, checker: EnvChecker | None = None) -> float:
    """The taskset's reward for the completion (0 after a timeout)."""
    checker = checker or _checker
    checker.warm(["load", info["env"], info["args"]])
    got = checker.call([info, completion])
    return 0.0 if got is None else float(got)


if __name__ == "__main__":
    _import()
    serve(_score)
