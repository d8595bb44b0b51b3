"""Group-relative advantages.

Every sample's reward minus its group's mean (`centred_rewards`), then
divided by a spread chosen by `trainer.advantage_scale` (`scale_advantages`):

    group  A = (r − mean_g) / (std_g + 1e-6)   GRPO's; std_g over the group
    batch  A = (r − mean_g) / (std_B + 1e-6)   std_B over the step's centred rewards
    none   A = r − mean_g                      Dr. GRPO's

std is the population standard deviation. A group whose rewards are all equal
has zero advantage everywhere and teaches nothing; `has_signal` tells the batch
builder to drop it (online filtering).
"""

from __future__ import annotations

import math

EPS = 1e-6


def centred_rewards(rewards: list[float]) -> tuple[list[float], float]:
    """Each reward minus the group's mean, and the group's std."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [r - mean for r in rewards], std


def group_advantages(rewards: list[float]) -> list[float]:
    centred, std = centred_rewards(rewards)
    return [c / (std + EPS) for c in centred]


def scale_advantages(samples: list, scale: str) -> None:
    """Set each sample's advantage from its centred reward (in place), once per step.
    `samples` carry the centred reward in `advantage` and their group's std."""
    if scale == "none" or not samples:
        return
    if scale == "group":
        for s in samples:
            s.advantage = s.advantage / (s.group_std + EPS)
        return
    if scale != "batch":
        raise ValueError(f"unknown advantage scale {scale!r}")
    std = math.sqrt(sum(s.advantage**2 for s in samples) / len(samples))
    for s in samples:
        s.advantage = s.advantage / (std + EPS)


def has_signal(rewards: list[float], tol: float = 1e-9) -> bool:
    return max(rewards) - min(rewards) > tol
