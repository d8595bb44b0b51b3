"""The grader registry: score a completion against a task, keyed by task_type.

Each grader returns a task reward in [0, 1]. `reverse_text` and `addition` are
graded by tasks/graders/text.py. `reasoning_gym` and `verifiers` use the scorer of the task family or
environment they come from (tasks/sources/gym.py, tasks/sources/environments.py). `math` extracts the final answer (the last \\boxed{}, else a pattern) and
compares it symbolically with math-verify in a time-bounded process
(tasks/graders/math.py). `code` runs the completion's program against the task's
tests in a sandbox (tasks/graders/code.py, tasks/graders/sandbox.py). A run with
`task.reward` grades every task with that function instead
(tasks/graders/custom.py), in the processes that `configure` set it up in.
"""

from __future__ import annotations

from collections.abc import Callable

from swarmrl.tasks.graders.checker import strict as checker_strict
from swarmrl.tasks.graders.custom import active_reward
from swarmrl.tasks.graders.text import score_addition, score_reverse_text
from swarmrl.tasks.schema import Task

Verifier = Callable[[Task, str], float]


def score_math_task(task: Task, completion: str) -> float:
    """`math`: verification_info {"answer": ground truth, "pattern": optional regex
    for the answer when the completion has no \\boxed{}} (tasks/graders/math.py)."""
    from swarmrl.tasks.graders.math import score_math

    info = task.verification_info
    return score_math(completion, str(info["answer"]), info.get("pattern"))


def score_code_task(task: Task, completion: str) -> float:
    """`code`: verification_info {"tests": [...]} (tasks/graders/code.py)."""
    from swarmrl.tasks.graders.code import score_code

    return score_code(completion, task.verification_info)


def score_gym_task(task: Task, completion: str) -> float:
    """`reasoning_gym`: the family's own scorer (tasks/sources/gym.py)."""
    from swarmrl.tasks.sources.gym import score_gym

    return score_gym(task.verification_info, completion)


def score_env_task(task: Task, completion: str, replies: list[str] | None = None) -> float:
    """`verifiers`: the taskset's own rewards (tasks/sources/environments.py);
    `replies`, a trajectory's model spans, for a taskset's own environment."""
    from swarmrl.tasks.sources.environments import score_env

    return score_env(task.verification_info, completion, replies)


VERIFIERS: dict[str, Verifier] = {
    "reverse_text": score_reverse_text,
    "addition": score_addition,
    "multiplication": score_addition,  # the same rule: the last integer, exactly
    "math": score_math_task,
    "code": score_code_task,
    "reasoning_gym": score_gym_task,
    "verifiers": score_env_task,
}


def info_error(task: Task) -> str | None:
    """Why the task's verification_info cannot be graded by its verifier, or None;
    the message names the field (task files are checked with this on load)."""
    info = task.verification_info
    if task.task_type in ("reverse_text", "addition", "multiplication", "math") and (
        "answer" not in info
    ):
        return "field 'verification_info.answer' is missing"
    if task.task_type == "reasoning_gym":
        missing = {"family", "seed", "size", "item", "options"} - set(info)
        if missing:
            return f"verification_info: missing {sorted(missing)}"
    if task.task_type == "verifiers":
        missing = {"env", "args", "row"} - set(info)
        if missing:
            return f"verification_info: missing {sorted(missing)}"
    if task.task_type == "code":
        from swarmrl.tasks.graders.code import validate_tests

        why = validate_tests(info)
        return None if why is None else f"verification_info: {why}"
    return None


def verify(
    task: Task, completion: str, replies: list[str] | None = None, strict: bool = False
) -> float:
    """The task's reward for `completion`; `replies`: the model's spans when the
    completion is a trajectory (`models/prompting.py: model_replies`), which the
    `verifiers` grader plays through a taskset's own environment. With the run's own
    reward function (`configure_reward`), its score of the completion's whole text.
    `strict` (the validator's re-grading): a grading process that gives no answer
    raises RewardUnavailable (tasks/graders/checker.py) instead of scoring 0."""
    if strict:
        with checker_strict():
            return verify(task, completion, replies)
    custom = active_reward()
    if custom is not None:
        return custom.score(task, completion)
    if replies is not None and task.task_type == "verifiers":
        return score_env_task(task, completion, replies)
    try:
        verifier = VERIFIERS[task.task_type]
    except KeyError:
        raise KeyError(
            f"no verifier for task_type '{task.task_type}' (known: {sorted(VERIFIERS)})"
        ) from None
    return verifier(task, completion)
