"""The inference worker loop.

Forever: take the newest policy version allowed, ask for an assignment,
generate `groups_per_file` prompt groups of `group_size` completions (prompts
and Gumbel-max seeds fixed by the assignment, TOPLOC proofs built from the
hidden states on the way), score them with the task's verifier, write one
rollout file and put it in the store, where a validator checks it before the
trainer may use it.
Weights are hot-swapped whenever a newer version is complete (downloaded
through SHARDCAST by default, see shardcast/source.py). The loop ends
when the trainer's status says the run is done.
"""

from __future__ import annotations

import logging
import time

from swarmrl.config import RunConfig
from swarmrl.inference.assigned import AssignedPrompt, assigned_prompts
from swarmrl.inference.backend import Completion, HFBackend
from swarmrl.inference.rollouts import write_rollouts
from swarmrl.models.loading import load_tokenizer
from swarmrl.models.prompting import decode_completion
from swarmrl.protocol.assign import Assignment, LocalAssigner, rollout_key
from swarmrl.protocol.identity import load_or_create_key, public_key_hex
from swarmrl.protocol.store import LocalDirStore
from swarmrl.shardcast.source import open_weights_source
from swarmrl.tasks.curriculum import SamplerState
from swarmrl.tasks.dataset import TaskSource
from swarmrl.tasks.length import length_penalty
from swarmrl.tasks.verifiers import verify

log = logging.getLogger("swarmrl.worker")


class Honest:
    """The worker's steps for one file. The cheats of `cheats.py` override some of
    them; an honest worker runs them as they are."""

    name = "honest"

    def after_load(self, backend) -> None:
        """Called after every weights load."""

    def plan(self, cfg: RunConfig, source, tokenizer, a: Assignment) -> list[AssignedPrompt]:
        return assigned_prompts(cfg, source, tokenizer, a.seed, a.sampler or SamplerState())

    def complete(self, cfg: RunConfig, backend, plan: list[AssignedPrompt]) -> list[Completion]:
        """One completion per sample, flat, group after group."""
        s = cfg.sampling
        prompts = [p.tokens for p in plan for _ in p.seeds]
        seeds = [seed for p in plan for seed in p.seeds]
        return backend.generate(prompts, seeds, s.max_new_tokens, s.temperature, s.top_p)

    def tamper(self, cfg, tokenizer, backend, plan, rows: list[dict]) -> list[dict]:
        return rows

    def upload(self, store, key: str, data: bytes) -> None:
        store.put(key, data)


def score_row(cfg: RunConfig, tokenizer, p: AssignedPrompt, g: int, j: int, c: Completion) -> dict:
    """The rollout row of sample j of group g, scored by the task's verifier."""
    completion = decode_completion(tokenizer, c.tokens)
    task_reward = verify(p.task, completion)
    lr = cfg.length_reward
    penalty = length_penalty(lr.mode, len(c.tokens), p.target_length, lr.coef)
    return {
        "problem_id": p.task.problem_id,
        "group": g,
        "prompt_tokens": p.tokens,
        "completion_tokens": c.tokens,
        "completion_logprobs": c.logprobs,
        "reward": task_reward - penalty,
        "task_reward": task_reward,
        "length_penalty": penalty,
        "target_length": p.target_length,
        "seed": p.seeds[j],
        "temperature": cfg.sampling.temperature,
        "proofs": c.proofs,
        "task_type": p.task.task_type,
        "prompt": p.text,
        "completion": completion,
    }


def build_rows(
    cfg: RunConfig, tokenizer, source: TaskSource, backend, a: Assignment, node: str, how=None
) -> list[dict]:
    how = how or Honest()
    plan = how.plan(cfg, source, tokenizer, a)
    completions = iter(how.complete(cfg, backend, plan))
    rows = []
    for g, p in enumerate(plan):
        for j in range(len(p.seeds)):
            row = score_row(cfg, tokenizer, p, g, j, next(completions))
            rows.append(row | {"step": a.step, "policy_step": a.policy_step, "node": node})
    return how.tamper(cfg, tokenizer, backend, plan, rows)


def run_worker(cfg: RunConfig, index: int, cheat: str | None = None) -> None:
    import torch

    torch.set_num_threads(cfg.worker.threads)
    paths = cfg.run_paths()
    name = f"cheater-{index}" if cheat else f"worker-{index}"
    how = Honest()
    if cheat:
        from swarmrl.inference.cheats import make_cheat

        how = make_cheat(cheat, seed=index)
    # The node's identity is its ed25519 public key; it seeds the node's assignments.
    node = public_key_hex(load_or_create_key(paths["nodes"] / name / "node.key"))
    weights = open_weights_source(cfg, name)
    store = LocalDirStore(paths["store"])
    max_pending = cfg.worker.max_pending_groups or cfg.trainer.batch_groups
    assigner = LocalAssigner(paths["status"], store, cfg.seed, cfg.async_level, max_pending)
    source = TaskSource(cfg.task, cfg.seed)
    tokenizer = load_tokenizer(cfg.model.path)
    backend = HFBackend(dtype=cfg.model.dtype)
    loaded: int | None = None
    log.info("%s node %s started (%s)", name, node, how.name)
    while True:
        newest = weights.newest()
        if newest is None:
            time.sleep(cfg.worker.poll_s)
            continue
        if newest != loaded:
            try:
                path = weights.open_verified(newest)
                t0 = time.time()
                backend.load(path)
                how.after_load(backend)
            except FileNotFoundError:
                # Recovered: retention deleted this version while we read it; look again.
                continue
            log.info("loaded policy version %d in %.2fs", newest, time.time() - t0)
            loaded = newest
        a = assigner.next(node, loaded)
        if a == "done":
            log.info("trainer reports the run done; worker exits")
            return
        if isinstance(a, str):
            time.sleep(cfg.worker.poll_s)
            continue
        t0 = time.time()
        rows = build_rows(cfg, tokenizer, source, backend, a, node, how)
        data = write_rollouts(rows)
        key = rollout_key(a, node, cfg.worker.groups_per_file)
        how.upload(store, key, data)
        n_tok = sum(len(r["completion_tokens"]) for r in rows)
        mean_r = sum(r["reward"] for r in rows) / len(rows)
        dt = time.time() - t0
        log.info(
            "step %d policy %d: %d samples, reward %.3f, %.0f tok/s -> %s",
            a.step,
            a.policy_step,
            len(rows),
            mean_r,
            n_tok / max(dt, 1e-9),
            key,
        )
