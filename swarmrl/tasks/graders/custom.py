"""A run's own reward function: `task.reward = "package.module:function"`.

The function is called as `function(prompt, completion, row)`:

- `prompt`: the problem's text (`Task.prompt`, with `task.instruction`; not the
  chat template, not a thinking-budget instruction);
- `completion`: the decoded completion (in a run with `[env]`, the whole
  trajectory: the model's spans and the environment's answers between them);
- `row`: the task record as a dict: `problem_id`, `prompt`, `task_type`,
  `verification_info` (the answer, for the built-in tasks), `metadata`;

and returns the task reward: an int, a float or a bool (True is 1.0), finite,
not clipped. It replaces the task's own verifier for every problem of the run,
whatever the source (generated, reasoning-gym, a task file, a verifiers
taskset); the length rule (tasks/length.py) applies after it as before.
Held-out scores (`swarmrl eval`, the launcher's start and final scores) keep
the task's own verifier, exact answers, so that they compare across rewards.

Where it runs: like the third-party graders, in a checker process
(tasks/graders/checker.py, `python -m swarmrl.tasks.graders.custom`) that
imports the module once; each call is bounded by `TIMEOUT_S`, and a completion
past it scores 0. Workers and validators both grade through it
(`tasks/grading.py: configure`), so a validator recomputes exactly what an honest
worker reports. The checker bounds time, not what the function may do: it is
the operator's code, trusted as the run's config is, reading untrusted
completions (no sandbox). The module must be importable by that child on every
worker and validator, and on the orchestrator unless `task.reward_fingerprint`
is set: installed, or on PYTHONPATH (`python -m` also puts the working
directory first).

Pinning: the fingerprint is the spec and a sha256 of the module's file (and of
the file of the module that defines the function, when it was imported from
elsewhere). Helper modules it imports, the libraries it uses and the Python
version are not covered. The orchestrator serves its fingerprint as
`task.reward_fingerprint`; a node whose own differs refuses to start
(`check_pin`).

The start-up probe (`load_reward`, on the orchestrator, every worker and every
validator): the function is imported and called twice on the first
`PROBE_PROBLEMS` problems of the run's train split, each with an empty
completion and with the problem's answer (`verification_info.answer`, else
`SAMPLE_COMPLETION`). A module that cannot be imported, a name that is not a
function, a call that raises, returns a non-number or a non-finite number, or
two calls that disagree refuse the start with a `TaskError` that says which,
on which problem. Past the probe, a call that raises or returns what the probe
would refuse scores that completion 0 (a warning in the log), on workers and
validators alike: a reward that fails on odd text does not stop the run. A
function that is not deterministic in a way the probe does not catch makes
validators reject honest files; that is what the probe is there to prevent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from swarmrl.tasks.graders.checker import START_TIMEOUT_S, CheckerProcess, serve
from swarmrl.tasks.schema import Task, TaskError

log = logging.getLogger("swarmrl.tasks.graders.custom")

TIMEOUT_S = 10.0  # per call, as a verifiers taskset's rewards
PROBE_PROBLEMS = 3
SAMPLE_COMPLETION = "The answer is 42."
IMPORTABLE = (
    "the module must be importable by the orchestrator, every worker and every validator "
    "(installed, or on PYTHONPATH; the orchestrator needs it only while "
    "task.reward_fingerprint is empty)"
)
WARNINGS = 5  # failed calls logged per process (a reward that fails often would flood the log)


class RewardChecker(CheckerProcess):
    def __init__(self, timeout_s: float = TIMEOUT_S):
        super().__init__("swarmrl.tasks.graders.custom", timeout_s)


@dataclass
class CustomReward:
    """The run's reward function, imported and probed in its checker process."""

    spec: str
    fingerprint: str
    checker: RewardChecker
    failures: int = 0

    def answer(self, task: Task, completion: str) -> dict | None:
        """The child's answer for one completion: {"reward": x}, with "error" when the
        call failed (then x is 0); None after the time limit or the child's death."""
        row = task.model_dump(mode="json")
        return self.checker.call(["score", self.spec, task.prompt, completion, row])

    def score(self, task: Task, completion: str) -> float:
        """The task reward of `completion` (0 when the call fails or runs past
        `TIMEOUT_S`: the checker logs a timeout, this a failure)."""
        got = self.answer(task, completion)
        if got is None:
            return 0.0
        if "error" in got:
            self.failures += 1
            if self.failures <= WARNINGS:
                log.warning(
                    "task.reward %s %s on problem %s; scored 0 (failure %d here; only "
                    "the first %d are logged)", self.spec, got["error"], task.problem_id,
                    self.failures, WARNINGS,
                )  # fmt: skip
        return float(got["reward"])

    def close(self) -> None:
        self.checker.close()


def load_reward(spec: str, source) -> CustomReward:
    """Import the function in a fresh checker process and probe it on the first
    problems of `source` (a TaskSource); a TaskError names what is wrong."""
    checker = RewardChecker(timeout_s=START_TIMEOUT_S)  # importing may be slow; scoring not
    got = checker.call(["load", spec])
    if got is None or "error" in got:
        checker.close()
        why = got["error"] if got is not None else _no_answer(checker, START_TIMEOUT_S)
        raise TaskError(f"task.reward '{spec}': {why}")
    checker.timeout_s = TIMEOUT_S
    checker.warm(["load", spec])  # a replaced child imports it before its first timed call
    reward = CustomReward(spec, got["fingerprint"], checker)
    try:
        probe(reward, source)
    except TaskError:
        reward.close()
        raise
    log.info("the task reward is %s (%s)", spec, reward.fingerprint)
    return reward


def probe(reward: CustomReward, source) -> None:
    """Call the function twice on each probe case; a TaskError for the first failure."""
    for i in range(PROBE_PROBLEMS):
        task = source.get("train", i)
        answer = task.verification_info.get("answer")
        for completion in ("", SAMPLE_COMPLETION if answer is None else str(answer)):
            where = f"on problem {task.problem_id} with completion {completion!r}"
            values = []
            for _ in range(2):
                got = reward.answer(task, completion)
                if got is None:
                    why = _no_answer(reward.checker, TIMEOUT_S)
                    raise TaskError(f"task.reward '{reward.spec}': {why} {where}")
                if "error" in got:
                    raise TaskError(f"task.reward '{reward.spec}' {got['error']} {where}")
                values.append(got["reward"])
            if values[0] != values[1]:
                raise TaskError(
                    f"task.reward '{reward.spec}' is not deterministic: it returned {values[0]!r} "
                    f"and then {values[1]!r} {where}; workers and validators must compute the "
                    "same reward from the same arguments (no randomness, clock or state kept "
                    "between calls)"
                )


def _no_answer(checker: CheckerProcess, timeout_s: float) -> str:
    if checker.crashed:
        return "its checker process died (the function or its module ended the process)"
    return f"no answer within {timeout_s:.0f} s"


def check_pin(pinned: str, mine: str) -> None:
    """Refuse to grade with another reward than the run's (`pinned`: the served
    `task.reward_fingerprint`; `mine`: this node's; empty: the task's own verifier)."""
    if pinned != mine:
        own = "the task's own verifier"
        raise TaskError(
            f"this run's reward is {pinned or own} (task.reward_fingerprint) and this node's "
            f"is {mine or own}: its rewards could differ from the other nodes', which a "
            "validator would take for a cheat; set the run's task.reward and install the "
            "run's version of its module"
        )


_ACTIVE: list[CustomReward | None] = [None]


def use_reward(reward: CustomReward | None) -> None:
    """Grade this process's completions with `reward` (None: the tasks' own verifiers)."""
    if _ACTIVE[0] is not None and _ACTIVE[0] is not reward:
        _ACTIVE[0].close()
    _ACTIVE[0] = reward


def active_reward() -> CustomReward | None:
    """The reward this process grades with, if the run has its own."""
    return _ACTIVE[0]


def reward_fingerprint() -> str:
    """The fingerprint of the reward this process grades with ("": the tasks' own)."""
    return "" if _ACTIVE[0] is None else _ACTIVE[0].fingerprint


# ---- the checker process: imports the function and calls it

_FUNCTIONS: dict[str, object] = {}


def _import(spec: str):
    """The function of `spec`, and the fingerprint of its source; ValueError saying why not."""
    import hashlib
    import importlib
    import inspect
    from pathlib import Path

    module_name, name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # recovered: the parent refuses the start, naming the error
        raise ValueError(
            f"cannot import module '{module_name}': {type(e).__name__}: {e}; {IMPORTABLE}"
        ) from None
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"module '{module_name}' ({module.__file__}) has no '{name}'")
    if not callable(fn):
        raise ValueError(
            f"'{name}' in module '{module_name}' is not a function ({type(fn).__name__})"
        )
    files = [getattr(module, "__file__", None)]
    defined_in = inspect.getmodule(fn)
    if defined_in is not None and defined_in is not module:
        files.append(getattr(defined_in, "__file__", None))
    if not all(files):
        raise ValueError(f"module '{module_name}' has no source file to pin")
    code = hashlib.sha256()
    for f in dict.fromkeys(files):
        data = Path(f).read_bytes()
        code.update(f"{len(data)}\0".encode() + data)
    return fn, f"{spec}, source {code.hexdigest()[:16]}"


def _call(fn, prompt: str, completion: str, row: dict) -> dict:
    import math
    import numbers
    import traceback
    from pathlib import Path

    try:
        value = fn(prompt, completion, row)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # recovered: a failing call scores 0, and the parent says why
        frame = traceback.extract_tb(e.__traceback__)[-1]
        at = f" ({Path(frame.filename).name} line {frame.lineno})"
        return {"reward": 0.0, "error": f"raised {type(e).__name__}: {e}{at}"}
    if not isinstance(value, numbers.Real):
        shown = repr(value)[:80]
        return {"reward": 0.0, "error": f"returned {type(value).__name__} {shown}, not a number"}
    try:
        reward = float(value)
    except OverflowError:
        reward = math.inf
    if not math.isfinite(reward):
        return {"reward": 0.0, "error": f"returned {reward}, not a finite number"}
    return {"reward": reward}


def _answer(request: list) -> dict:
    """["load", spec]: {"fingerprint"}; ["score", spec, prompt, completion, row]:
    {"reward"}; either with "error" (and a reward of 0) when it failed."""
    spec = request[1]
    if spec not in _FUNCTIONS:
        try:
            _FUNCTIONS[spec] = _import(spec)
        except ValueError as e:
            return {"reward": 0.0, "error": str(e)}
    fn, fingerprint = _FUNCTIONS[spec]
    if request[0] == "load":
        return {"fingerprint": fingerprint}
    return _call(fn, *request[2:])


if __name__ == "__main__":
    serve(_answer)
