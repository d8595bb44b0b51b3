"""Group-relative advantages: A = (r − mean) / (std + 1e-6) within each prompt group.

std is the population standard deviation of the group's rewards. A group
whose rewards are all equal has zero advantage everywhere and teaches
nothing; `has_signal` tells the batch builder to drop it (online filtering).
"""

from __future__ import annotations

import math


def group_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) for r in rewards]


def has_signal(rewards: list[float], tol: float = 1e-9) -> bool:
    return max(rewards) - min(rewards) > tol
