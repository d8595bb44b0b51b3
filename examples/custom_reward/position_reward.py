"""A reward of your own for swarmrl: full credit for the exact answer, partial
credit for each character in its right place.

Put this directory on PYTHONPATH for every process of the run (or install the
module), then name the function in the run's config:

    [task]
    name = "reverse_text"
    reward = "position_reward:score"

or on the command line, for the tiny run:

    PYTHONPATH=examples/custom_reward swarmrl rl --config configs/tiny.toml \\
        task.reward=position_reward:score

Every process of the run imports it: the orchestrator pins its source and probes
it (unless `task.reward_fingerprint` names the fingerprint the nodes must have),
workers and validators grade with it, each in a checker process.

swarmrl calls `score(prompt, completion, row)` and probes it at start: it must
be importable, return a finite number (an int, a float or a bool) and return
the same number for the same arguments. `row` is the task record; the built-in
tasks (reverse_text, addition, multiplication) and math tasks keep the expected
answer in `row["verification_info"]["answer"]`.

The rule: 1.0 when the completion (stripped) is the answer; otherwise half a
point times the characters that match the answer's at the same position, over
the longer of the two. An exact answer is worth twice any near miss, and
padding a good start with more text does not pay.
"""

from __future__ import annotations


def score(prompt: str, completion: str, row: dict) -> float:
    answer = str(row["verification_info"]["answer"])
    got = completion.strip()
    if got == answer:
        return 1.0
    right = sum(a == b for a, b in zip(got, answer, strict=False))
    return 0.5 * right / max(len(got), len(answer))
