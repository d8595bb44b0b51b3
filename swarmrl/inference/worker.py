"""The inference worker loop.

Forever: take the newest policy version allowed, ask for an assignment,
generate `groups_per_file` prompt groups of `group_size` completions, score
them with the task's verifier, write one rollout file and put it in the store.
Weights are hot-swapped whenever a newer version is complete (downloaded
through SHARDCAST by default, see shardcast/source.py). The loop ends
when the trainer's status says the run is done.
"""

from __future__ import annotations

import logging
import os
import random
import time

from swarmrl.config import RunConfig
from swarmrl.inference.backend import HFBackend
from swarmrl.inference.rollouts import write_rollouts
from swarmrl.models.loading import load_tokenizer
from swarmrl.models.prompting import decode_completion, encode_prompt, prompt_text
from swarmrl.protocol.assign import (
    Assignment,
    LocalAssigner,
    prompt_indices,
    rollout_key,
)
from swarmrl.protocol.store import LocalDirStore
from swarmrl.shardcast.source import open_weights_source
from swarmrl.tasks.dataset import TaskSource
from swarmrl.tasks.length import length_penalty
from swarmrl.tasks.verifiers import verify

log = logging.getLogger("swarmrl.worker")


def build_rows(
    cfg: RunConfig, tokenizer, source: TaskSource, backend, a: Assignment, node: str
) -> list[dict]:
    indices = prompt_indices(a.seed, cfg.worker.groups_per_file)
    tasks = [source.get("train", i) for i in indices]
    lr = cfg.length_reward
    rng = random.Random(a.seed)
    targets = [rng.choice(lr.targets) if lr.mode != "none" else 0 for _ in tasks]
    texts = [prompt_text(t.prompt, tl) for t, tl in zip(tasks, targets, strict=True)]
    prompts = [encode_prompt(tokenizer, x) for x in texts]
    groups = backend.generate(
        prompts,
        n=cfg.worker.group_size,
        max_new_tokens=cfg.sampling.max_new_tokens,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        seed=a.seed,
    )
    rows = []
    for g, (task, target, text, ptoks, comps) in enumerate(
        zip(tasks, targets, texts, prompts, groups, strict=True)
    ):
        for c in comps:
            completion = decode_completion(tokenizer, c.tokens)
            task_reward = verify(task, completion)
            penalty = length_penalty(lr.mode, len(c.tokens), target, lr.coef)
            rows.append(
                {
                    "problem_id": task.problem_id,
                    "group": g,
                    "prompt_tokens": ptoks,
                    "completion_tokens": c.tokens,
                    "completion_logprobs": c.logprobs,
                    "reward": task_reward - penalty,
                    "task_reward": task_reward,
                    "length_penalty": penalty,
                    "target_length": target,
                    "step": a.step,
                    "policy_step": a.policy_step,
                    "seed": a.seed,
                    "temperature": cfg.sampling.temperature,
                    "proofs": b"",
                    "node": node,
                    "task_type": task.task_type,
                    "prompt": text,
                    "completion": completion,
                }
            )
    return rows


def run_worker(cfg: RunConfig, index: int) -> None:
    import torch

    torch.set_num_threads(cfg.worker.threads)
    paths = cfg.run_paths()
    # Until nodes have keys (protocol issue) a node is a random id per process.
    node = os.urandom(16).hex()
    weights = open_weights_source(cfg, f"worker-{index}")
    store = LocalDirStore(paths["store"])
    max_pending = cfg.worker.max_pending_groups or cfg.trainer.batch_groups
    assigner = LocalAssigner(paths["status"], store, cfg.seed, cfg.async_level, max_pending)
    source = TaskSource(cfg.task, cfg.seed)
    tokenizer = load_tokenizer(cfg.model.path)
    backend = HFBackend(dtype=cfg.model.dtype)
    loaded: int | None = None
    log.info("worker %d node %s started", index, node)
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
        rows = build_rows(cfg, tokenizer, source, backend, a, node)
        data = write_rollouts(rows)
        key = rollout_key(a, node, cfg.worker.groups_per_file)
        store.put(key, data)
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
