"""Collecting a training batch from the rollout store.

For step n the collector takes rollout files in key order (step, node, counter) and
- discards files whose policy version is older than n − async_level (stale),
- with validators, waits for each file's verdict and takes it only if a
  trusted validator signed an acceptance of exactly its bytes,
- rejects files that fail validation (moved under `rejected/` with a
  `.reason.txt` beside them, logged, counted; the run goes on),
- drops groups whose rewards are all equal (zero advantage: online filtering),
- recomputes advantages from the rewards itself,
until it holds exactly `need_groups` groups. Groups with signal beyond that
are carried to the next step (and dropped there if they have become stale);
the carry is part of the trainer state, so a resumed run neither loses nor
repeats them. An accepted file moves from `rollouts/` to `consumed/` as soon
as it is read, so workers stop counting it as pending (counting it deadlocked
a run whose pending files held too few groups with signal); the trainer
deletes it once the step's version is published, and a resumed trainer moves
back any consumed file its last published step did not use.

Every group read is also reported as a `GroupOutcome` (its file's step and
problem, every sample's reward), dropped ones included: the curriculum
(tasks/curriculum.py) learns from these what the policy has mastered.

Two rewards are reported: `reward` in the metrics averages every sample read
for this step (the sampling policy's real performance), `reward_trained` only
the groups trained on (biased: solved and failed groups are filtered out).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from swarmrl.inference.rollouts import Limits, RolloutFileError, read_rollouts
from swarmrl.protocol.assign import parse_rollout_key
from swarmrl.tasks.curriculum import GroupOutcome
from swarmrl.trainer.advantages import group_advantages, has_signal
from swarmrl.validator.checks import sha256
from swarmrl.validator.record import read_verdict, verdict_key

log = logging.getLogger("swarmrl.trainer")


@dataclass
class Sample:
    prompt_tokens: list[int]
    completion_tokens: list[int]
    advantage: float
    reward: float
    task_reward: float
    length_penalty: float
    policy_step: int


@dataclass
class Batch:
    samples: list[Sample] = field(default_factory=list)
    groups: int = 0
    read_samples: int = 0
    read_reward_sum: float = 0.0
    read_task_reward_sum: float = 0.0
    stale_groups: int = 0
    consumed: list[str] = field(default_factory=list)
    accepted_files: int = 0
    rejected_files: int = 0
    stale_files: int = 0
    dropped_groups: int = 0
    wait_s: float = 0.0
    outcomes: list[GroupOutcome] = field(default_factory=list)  # every group read, in order


def consumed_key(key: str) -> str:
    return "consumed/" + key.removeprefix("rollouts/")


def used_verdict_key(consumed: str) -> str:
    """Where the verdict of a consumed file goes: beside it, out of verdicts/, so that
    the same bytes uploaded again under the same name meet the validator's ledger
    (a replay) instead of the old verdict."""
    return consumed.removesuffix(".parquet") + ".verdict.json"


def delete_consumed(store, keys: list[str]) -> None:
    for key in keys:
        store.delete(key)
        store.delete(used_verdict_key(key))


def restore_unpublished(store) -> int:
    """After a crash: move consumed files no published step used back to rollouts/,
    with their verdicts. Call it after deleting the files the last published step
    consumed."""
    keys = store.list("consumed")
    moved = 0
    for key in keys:
        back = "rollouts/" + key.removeprefix("consumed/")
        if key.endswith(".verdict.json"):
            back = verdict_key(back.removesuffix(".verdict.json") + ".parquet")
        else:
            moved += 1
        store.put(back, store.get(key))
        store.delete(key)
    return moved


class BatchCollector:
    """`validators`: the keys whose signed verdicts are trusted; when given, a file
    is taken only once one of them accepted exactly these bytes (None: files
    are taken as they come, with the schema checks only)."""

    def __init__(
        self,
        store,
        limits: Limits,
        async_level: int,
        poll_s: float,
        validators: list[str] | None = None,
    ):
        self.store = store
        self.validators = validators
        # sha256 -> policy version of the files taken while they could still be fresh:
        # a file (or its bytes under another name) is never taken twice
        self.taken: dict[str, int] = {}
        self.rejected_seen = self.rejected_count()
        self.limits = limits
        self.async_level = async_level
        self.poll_s = poll_s
        self.carry: list[list[Sample]] = []  # groups with signal, read but not yet trained on

    def reject(self, key: str, data: bytes | None, reason: str) -> None:
        name = key.replace("/", "__")
        if data is not None:
            self.store.put(f"rejected/{name}", data)
        self.store.put(f"rejected/{name}.reason.txt", reason.encode())
        self.store.delete(key)
        log.warning("rejected %s: %s", key, reason)

    def collect(
        self, step: int, need_groups: int, should_stop: Callable[[], bool] = lambda: False
    ) -> Batch:
        batch = Batch()
        t0 = last_note = time.time()
        self.taken = {h: p for h, p in self.taken.items() if p >= step - self.async_level}
        carried, self.carry = self.carry, []
        for group in carried:
            if group[0].policy_step < step - self.async_level:
                batch.stale_groups += 1
            else:
                self._add(batch, group, need_groups)
        while batch.groups < need_groups:
            keys = [k for k in self.store.list("rollouts") if k not in batch.consumed]
            taken = 0
            for key in keys:
                if batch.groups >= need_groups:
                    break
                taken += self._take(key, step, batch, need_groups)
            if not taken:
                if should_stop():
                    raise InterruptedError("stopped while waiting for rollouts")
                if time.time() - last_note > 30:
                    last_note = time.time()
                    log.warning(
                        "step %d: waiting %.0fs for rollouts (%d/%d groups)",
                        step,
                        last_note - t0,
                        batch.groups,
                        need_groups,
                    )
                time.sleep(self.poll_s)
        batch.wait_s = time.time() - t0
        rejected = self.rejected_count()
        batch.rejected_files, self.rejected_seen = rejected - self.rejected_seen, rejected
        return batch

    def rejected_count(self) -> int:
        """Files rejected so far in this run, by the validators or by the trainer."""
        return sum(k.endswith(".reason.txt") for k in self.store.list("rejected"))

    def _add(self, batch: Batch, group: list[Sample], need_groups: int) -> None:
        if batch.groups < need_groups:
            batch.samples.extend(group)
            batch.groups += 1
        else:
            self.carry.append(group)

    def _take(self, key: str, step: int, batch: Batch, need_groups: int) -> bool:
        """Take one file if it is ready; False when it must wait for its verdict."""
        info = parse_rollout_key(key)
        if info is None:
            self.reject(key, self._get(key), "unrecognised rollout key")
            batch.rejected_files += 1
            return True
        if info["policy"] < step - self.async_level:
            self.store.delete(key)
            batch.stale_files += 1
            log.info(
                "discarded stale %s (policy %d < %d)", key, info["policy"], step - self.async_level
            )
            return True
        if self.validators is not None and not self.store.exists(verdict_key(key)):
            return False
        data = self._get(key)
        if data is None:  # rejected and moved by the validator meanwhile
            return True
        verdict = None
        digest = sha256(data)
        try:
            if digest in self.taken:
                raise RolloutFileError("these bytes were trained on already (a replay)")
            if self.validators is not None:
                verdict = self._check_verdict(key, data)
            rows = read_rollouts(data, self.limits)
            if any(r["policy_step"] != info["policy"] for r in rows):
                raise RolloutFileError("policy_step column disagrees with the file's key")
        except RolloutFileError as e:
            self.reject(key, data, str(e))
            batch.rejected_files += 1
            return True
        batch.accepted_files += 1
        self.taken[digest] = info["policy"]
        consumed = consumed_key(key)
        self.store.put(consumed, data)
        if verdict is not None:
            self.store.put(used_verdict_key(consumed), verdict)
        self.store.delete(key)
        if verdict is not None:
            self.store.delete(verdict_key(key))
        batch.consumed.append(consumed)
        by_group: dict[int, list[dict]] = {}
        for r in rows:
            by_group.setdefault(r["group"], []).append(r)
        for group_rows in by_group.values():
            rewards = [r["reward"] for r in group_rows]
            task_rewards = [r["task_reward"] for r in group_rows]
            batch.read_samples += len(rewards)
            batch.read_reward_sum += sum(rewards)
            batch.read_task_reward_sum += sum(task_rewards)
            batch.outcomes.append(
                GroupOutcome(info["step"], group_rows[0]["problem_id"], rewards, task_rewards)
            )
            if not has_signal(rewards):
                batch.dropped_groups += 1
                continue
            group = [
                Sample(
                    prompt_tokens=r["prompt_tokens"],
                    completion_tokens=r["completion_tokens"],
                    advantage=adv,
                    reward=r["reward"],
                    task_reward=r["task_reward"],
                    length_penalty=r["length_penalty"],
                    policy_step=r["policy_step"],
                )
                for r, adv in zip(group_rows, group_advantages(rewards), strict=True)
            ]
            self._add(batch, group, need_groups)
        return True

    def _get(self, key: str) -> bytes | None:
        try:
            return self.store.get(key)
        except FileNotFoundError:
            return None

    def _check_verdict(self, key: str, data: bytes) -> bytes:
        """The verdict's bytes, if it is a trusted acceptance of exactly `data`."""
        raw = self._get(verdict_key(key))
        v = read_verdict(raw, self.validators) if raw is not None else None
        if v is None:
            raise RolloutFileError("its verdict is not signed by a trusted validator")
        if v.key != key or v.sha256 != sha256(data):
            raise RolloutFileError("the file is not the one its verdict judged")
        if not v.accepted:
            raise RolloutFileError(f"rejected by the validator: {v.check}: {v.reason}")
        return raw
