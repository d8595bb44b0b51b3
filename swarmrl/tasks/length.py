"""Length rewards: a controllable thinking budget.

With a target T per prompt (drawn from a small set and stated in the prompt),
the penalty on a completion of n tokens is:
- exact: coef · |n − T|          (hit the budget)
- max:   coef · max(0, n − T)    (stay under it)
- clip:  min(1, coef · |n − T|)  (exact, but never more than the whole reward)
The reward is task_reward − penalty.
"""

from __future__ import annotations


def length_penalty(mode: str, n_tokens: int, target: int, coef: float) -> float:
    if mode == "none" or target <= 0:
        return 0.0
    if mode == "exact":
        return coef * abs(n_tokens - target)
    if mode == "max":
        return coef * max(0, n_tokens - target)
    if mode == "clip":
        return min(1.0, coef * abs(n_tokens - target))
    raise ValueError(f"unknown length reward mode '{mode}'")


def budget_instruction(target: int) -> str:
    return f"Think for {target} tokens before giving a response."
