"""Collecting a training batch from the files the orchestrator lists as accepted.

For step n the collector asks its queue (the orchestrator: `GET
/v1/trainer/files`) for accepted files whose policy is at least n − async_level,
the oldest policy first, then in key order (step, node, counter), and for each
- downloads it through its signed URL and checks that the bytes are the ones
  submitted (sha256),
- with validators, takes it only if a trusted validator signed an acceptance
  of exactly these bytes (or, with spot-checking, if the orchestrator did not
  draw it for validation),
- reads it with the run's limits within `READ_TIMEOUT_S`; a file that fails is
  reported to the orchestrator as rejected (logged, counted; the run goes on). A
  file the reader could not decide on (its decoder died, ran out of time or
  memory: `RolloutUnreadable`) is skipped and tried once more when the queue
  lists it again (the next step); a second failure refuses it without blame (a
  hostile file holds the collection for at most twice `READ_TIMEOUT_S` in all),
- marks it consumed for step n (`POST /v1/trainer/consume`): a file voided
  meanwhile (its node was caught cheating) is not used,
- drops groups whose rewards are all equal (zero advantage: online filtering),
- recomputes advantages from the rewards itself,
until it holds exactly `need_groups` groups. Groups with signal beyond that
are carried to the next step (and dropped there if they have become stale);
the carry is part of the trainer state, so a resumed run neither loses nor
repeats them: on resume the orchestrator puts back the files consumed by
steps after the resumed version.

Every group read is also reported as a `GroupOutcome` (its file's step and
problem, every sample's reward), dropped ones included: the curriculum
(tasks/curriculum.py) learns from these what the policy has mastered.

Two rewards are reported: `reward` in the metrics averages every sample read
for this step (the sampling policy's real performance), `reward_trained` only
the groups trained on (biased: solved and failed groups are filtered out).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from swarmrl.protocol.assign import parse_rollout_key
from swarmrl.protocol.rollouts import (
    Limits,
    RolloutFileError,
    RolloutUnreadable,
    read_rollouts,
    sha256,
)
from swarmrl.protocol.verdict import read_verdict
from swarmrl.tasks.curriculum import GroupOutcome
from swarmrl.trainer.advantages import centred_rewards, has_signal

log = logging.getLogger("swarmrl.trainer")
# an honest file of the largest shape decodes in about a second on a loaded CPU; past
# this the reader gives up on it for now (it is not the sender's fault: module doc)
READ_TIMEOUT_S = 30.0


@dataclass
class Sample:
    """One completion to train on. `advantage` is the reward minus its group's mean until
    `scale_advantages` (trainer/advantages.py) divides it by the chosen std.
    `behav_logprobs`: the log-prob of each completion token under the distribution the
    worker sampled from (None: unknown, no importance weight); `temperature` that
    distribution's; `node`, `file`, `checked`: where it came from, and whether a
    validator checked that file. `completion_mask`: 1 at the tokens the model sampled,
    0 at those an environment inserted (a tool's result), which the loss, the
    importance weights and the mismatch figures leave out; None: all the model's."""

    prompt_tokens: list[int]
    completion_tokens: list[int]
    advantage: float
    reward: float
    task_reward: float
    length_penalty: float
    policy_step: int
    behav_logprobs: list[float] | None = None
    temperature: float = 1.0
    group_std: float = 1.0
    node: str = ""
    file: str = ""
    checked: bool = True
    completion_mask: list[int] | None = None

    @property
    def model_tokens(self) -> int:
        m = self.completion_mask
        return len(self.completion_tokens) if m is None else sum(m)


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


@dataclass
class QueuedFile:
    key: str
    sha256: str
    url: str
    verdict: dict | None
    checked: bool


class OrchestratorQueue:
    """The trainer's side of the orchestrator: accepted files in, consumption out."""

    def __init__(self, client, max_bytes: int):
        self.client = client
        self.max_bytes = max_bytes

    def ready(self, step: int) -> tuple[list[QueuedFile], int, int, bool]:
        """Files ready for `step`, files rejected and gone stale so far, and whether the
        run was stopped."""
        r = self.client.call("GET", "/v1/trainer/files", params={"step": step})
        files = [
            QueuedFile(f["key"], f["sha256"], f["url"], f["verdict"], f["checked"])
            for f in r["files"]
        ]
        stale = int(r["counts"].get("stale", 0)) + int(r["counts"].get("discarded", 0))
        return files, int(r["counts"].get("rejected", 0)), stale, bool(r["stopped"])

    def fetch(self, f: QueuedFile) -> bytes:
        return self.client.get_bytes(f.url, self.max_bytes)

    def consume(self, step: int, key: str) -> bool:
        r = self.client.call("POST", "/v1/trainer/consume", {"step": step, "keys": [key]})
        return key in r["consumed"]

    def reject(self, key: str, reason: str) -> None:
        self.client.call("POST", "/v1/trainer/reject", {"key": key, "reason": reason})


class BatchCollector:
    """`validators`: the keys whose signed verdicts are trusted (None: validation is
    off, files are taken with the schema checks only). `temperature`, `top_p`: the
    run's; a file sampled at another temperature or nucleus is rejected. `spot_checks`: files the
    orchestrator did not draw for validation are taken without a verdict."""

    def __init__(
        self,
        queue,
        limits: Limits,
        async_level: int,
        poll_s: float,
        validators: list[str] | None = None,
        spot_checks: bool = False,
        temperature: float = 1.0,
        top_p: float = 1.0,
    ):
        self.queue = queue
        self.temperature = temperature
        self.top_p = top_p
        self.validators = validators
        self.spot_checks = spot_checks
        # sha256 -> policy version of the files taken while they could still be fresh:
        # a file (or its bytes under another name) is never taken twice
        self.taken: dict[str, int] = {}
        self.rejected_seen: int | None = None  # orchestrator counts when this step began
        self.stale_seen = 0
        self.limits = limits
        self.async_level = async_level
        self.poll_s = poll_s
        self.carry: list[list[Sample]] = []  # groups with signal, read but not yet trained on
        self.read_timeout_s = READ_TIMEOUT_S
        self.unreadable: dict[str, int] = {}  # key -> reads that gave no decision

    def reject(self, key: str, reason: str) -> None:
        self.queue.reject(key, reason)
        log.warning("rejected %s: %s", key, reason)

    def collect(
        self, step: int, need_groups: int, should_stop: Callable[[], bool] = lambda: False
    ) -> Batch:
        batch = Batch()
        t0 = last_note = time.time()
        self.taken = {h: p for h, p in self.taken.items() if p >= step - self.async_level}
        self.unreadable = {
            k: n for k, n in self.unreadable.items()
            if (parse_rollout_key(k) or {"policy": -1})["policy"] >= step - self.async_level
        }  # fmt: skip
        carried, self.carry = self.carry, []
        for group in carried:
            if group[0].policy_step < step - self.async_level:
                batch.stale_groups += 1
            else:
                self._add(batch, group, need_groups)
        seen: set[str] = set()
        rejected = stale = 0
        while batch.groups < need_groups:
            files, rejected, stale, stopped = self.queue.ready(step)
            if self.rejected_seen is None:
                self.rejected_seen, self.stale_seen = rejected, stale
            if stopped:
                raise InterruptedError("the operator stopped the run")
            taken = 0
            for f in files:
                if batch.groups >= need_groups:
                    break
                if f.key in seen:
                    continue
                seen.add(f.key)
                self._take(f, step, batch, need_groups)
                taken += 1
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
        if self.rejected_seen is not None:
            batch.rejected_files = max(batch.rejected_files, rejected - self.rejected_seen)
            batch.stale_files += stale - self.stale_seen
            self.rejected_seen, self.stale_seen = rejected, stale
        return batch

    def _add(self, batch: Batch, group: list[Sample], need_groups: int) -> None:
        if batch.groups < need_groups:
            batch.samples.extend(group)
            batch.groups += 1
        else:
            self.carry.append(group)

    def _take(self, f: QueuedFile, step: int, batch: Batch, need_groups: int) -> None:
        info = parse_rollout_key(f.key)
        if info is None:
            self.reject(f.key, "unrecognised rollout key")
            return
        if info["policy"] < step - self.async_level:
            batch.stale_files += 1
            return
        try:
            data = self.queue.fetch(f)
            digest = sha256(data)
            if digest != f.sha256:
                raise RolloutFileError("the downloaded bytes are not the ones submitted")
            if digest in self.taken:
                raise RolloutFileError("these bytes were trained on already (a replay)")
            if self.validators is not None:
                self._check_verdict(f, digest)
            try:
                rows = read_rollouts(data, self.limits, timeout_s=self.read_timeout_s)
            except RolloutUnreadable as e:
                self.unreadable[f.key] = tries = self.unreadable.get(f.key, 0) + 1
                if tries < 2:  # skipped: the queue lists it again at the next step
                    log.warning("%s could not be read (%s); tried again later", f.key, e)
                    return
                raise RolloutFileError(f"unreadable twice, no one blamed: {e}") from None
            if any(r["policy_step"] != info["policy"] for r in rows):
                raise RolloutFileError("policy_step column disagrees with the file's key")
            # the trainer's log-probs are taken at the file's temperature and nucleus: an
            # unchecked file must not choose them (a validator checks the files it draws)
            if any(
                not math.isclose(r["temperature"], self.temperature, rel_tol=1e-6) for r in rows
            ):
                raise RolloutFileError(
                    f"sampled at another temperature than the run's {self.temperature:g}"
                )
            if any(not math.isclose(r["top_p"], self.top_p, rel_tol=1e-6) for r in rows):
                raise RolloutFileError(f"sampled at another top_p than the run's {self.top_p:g}")
        except RolloutFileError as e:
            self.reject(f.key, str(e))
            batch.rejected_files += 1
            return
        if not self.queue.consume(step, f.key):
            log.info("%s was voided before it could be used", f.key)
            return
        batch.accepted_files += 1
        self.taken[digest] = info["policy"]
        batch.consumed.append(f.key)
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
            centred, std = centred_rewards(rewards)
            checked = f.verdict is not None
            group = [
                Sample(
                    prompt_tokens=r["prompt_tokens"],
                    completion_tokens=r["completion_tokens"],
                    advantage=adv,
                    reward=r["reward"],
                    task_reward=r["task_reward"],
                    length_penalty=r["length_penalty"],
                    policy_step=r["policy_step"],
                    behav_logprobs=r["completion_logprobs"],
                    temperature=r["temperature"],
                    group_std=std,
                    node=info["node"],
                    file=f.key,
                    checked=checked,
                    completion_mask=_env_mask(r["completion_mask"]),
                )
                for r, adv in zip(group_rows, centred, strict=True)
            ]
            self._add(batch, group, need_groups)

    def _check_verdict(self, f: QueuedFile, digest: str) -> None:
        """A trusted acceptance of exactly these bytes, or a file not drawn for a spot check."""
        if f.verdict is None:
            if self.spot_checks and not f.checked:
                return
            raise RolloutFileError("no verdict, and validation of every file is required")
        v = read_verdict(json.dumps(f.verdict).encode(), self.validators)
        if v is None:
            raise RolloutFileError("its verdict is not signed by a trusted validator")
        if v.key != f.key or v.sha256 != digest:
            raise RolloutFileError("the file is not the one its verdict judged")
        if not v.accepted:
            raise RolloutFileError(f"rejected by the validator: {v.check}: {v.reason}")


def _env_mask(mask: list[int]) -> list[int] | None:
    """A row's mask, None where every token is the model's (single-turn rows)."""
    return None if all(mask) else mask
