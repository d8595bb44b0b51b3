"""Assignments and the names of rollout files.

An `Assignment` is what the orchestrator sends in a heartbeat answer
(orchestrator/work.py): the step, the policy version, the counter the
orchestrator issued, the seed derived from (run seed, node, step, counter)
and the sampler state of the step. Seed material and prompt indices are
derived by hashing, so a validator reproduces them and a worker cannot
choose them. `rollout_key` is the one name a file of an assignment has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from swarmrl.protocol.sampler import SamplerState

ROLLOUT_KEY = re.compile(
    r"^rollouts/step_(?P<step>\d+)/(?P<node>[0-9a-f]+)-(?P<counter>\d+)-p(?P<policy>\d+)-g(?P<groups>\d+)\.parquet$"
)


@dataclass(frozen=True)
class Assignment:
    step: int
    policy_step: int
    seed: int
    counter: int
    sampler: SamplerState | None = None  # None: the default state (level 0, no weights)
    max_new_tokens: int | None = None  # the node's length budget; None: sampling.max_new_tokens


def rollout_key(a: Assignment, node: str, groups: int) -> str:
    return f"rollouts/step_{a.step:06d}/{node}-{a.counter}-p{a.policy_step:06d}-g{groups}.parquet"


def parse_rollout_key(key: str) -> dict | None:
    """The key's fields, or None unless the key is exactly what rollout_key writes
    (one name per assignment: no other zero padding, no second spelling)."""
    m = ROLLOUT_KEY.match(key)
    if not m:
        return None
    info = {k: (v if k == "node" else int(v)) for k, v in m.groupdict().items()}
    a = Assignment(step=info["step"], policy_step=info["policy"], seed=0, counter=info["counter"])
    if rollout_key(a, info["node"], info["groups"]) != key:
        return None
    return info
