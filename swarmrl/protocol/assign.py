"""Work assignment: which step a worker generates for, with which policy and seeds.

An `Assignment` is what the orchestrator will send in a heartbeat answer. The
local assigner derives it from the trainer's status file (the step it is
collecting for) and the newest policy version:

- a worker may use policy v for step n only if n − v ≤ async_level; with an
  older policy it waits for a newer version;
- it produces while fewer than `max_pending_groups` groups wait in the store,
  so workers do not run far ahead of the trainer (files that still get too old
  are discarded by the trainer and counted as stale).

Seed material and prompt indices are derived by hashing (run seed, node, step,
counter), so they are reproducible by a validator and not chosen by a worker.
The assignment also carries the sampler state the trainer issued for its step
(tasks/curriculum.py), read from the same status file as the step itself.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swarmrl.tasks.curriculum import SamplerState

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


def derive_seed(*parts: object) -> int:
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


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


def read_status(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or mid-replace
        return None


class LocalAssigner:
    def __init__(
        self, status_path: Path, store, run_seed: int, async_level: int, max_pending_groups: int
    ):
        self.status_path = status_path
        self.store = store
        self.run_seed = run_seed
        self.async_level = async_level
        self.max_pending_groups = max_pending_groups
        self.counter = 0

    def trainer_step(self) -> int | None:
        status = read_status(self.status_path)
        return None if status is None else int(status["step"])

    def next(self, node: str, policy_version: int) -> Assignment | str:
        """An Assignment, or the reason to wait ('no-trainer', 'stale-policy', 'enough-pending', 'done')."""
        status = read_status(self.status_path)
        if status is None:
            return "no-trainer"
        if status.get("done"):
            return "done"
        step = int(status["step"])
        if step - policy_version > self.async_level:
            return "stale-policy"
        pending = 0
        for key in self.store.list("rollouts"):
            info = parse_rollout_key(key)
            if info and info["policy"] >= step - self.async_level:
                pending += info["groups"]
        if pending >= self.max_pending_groups:
            return "enough-pending"
        from swarmrl.tasks.curriculum import SamplerState

        sampler = SamplerState.from_json(status.get("sampler", {}))
        self.counter += 1
        seed = derive_seed(self.run_seed, node, step, self.counter)
        return Assignment(
            step=step, policy_step=policy_version, seed=seed, counter=self.counter, sampler=sampler
        )
