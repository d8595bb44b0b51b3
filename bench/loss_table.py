"""Losses × importance corrections on the default task, in one process.

The swarm's learning loop without its processes: rollouts are made by the
worker's own code (`build_rows`: seeded Gumbel sampling, the task's grader)
with the weights of `--lag` versions before the policy being trained (the
staleness a default run settles at, async_level 2), groups without signal are
dropped as the trainer's collector drops them, and the update is the
trainer's `grpo_update` with the chosen `trainer.loss` and
`trainer.is_correction`. Every setting gets the same number of steps of
`batch_groups` groups, then greedy exact-answer accuracy on the same held-out
problems as `make run`'s check (eval split, the config's difficulty).

The validator, the relays and the network are left out: what differs between
rows is the loss and the correction, not the swarm. Printed as one JSON
object per setting, and a table at the end.

    .venv/bin/python bench/loss_table.py [--config configs/default.toml] [--steps 10]
        [--seeds 0,1] [--losses grpo,dapo,...] [--corrections none,token_tis,...]
        [--eval 200] [--threads 1] [--out FILE.jsonl] [trainer.optimizer_steps=2 ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _samples(rows: list[dict], policy_step: int):
    """Groups with signal, as the collector builds them (centred rewards, group std)."""
    from swarmrl.trainer.advantages import centred_rewards, has_signal
    from swarmrl.trainer.batch import Sample

    groups: dict[int, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    out = []
    for g in groups.values():
        rewards = [r["reward"] for r in g]
        if not has_signal(rewards):
            continue
        centred, std = centred_rewards(rewards)
        out.append(
            [
                Sample(
                    r["prompt_tokens"],
                    r["completion_tokens"],
                    c,
                    r["reward"],
                    r["task_reward"],
                    r["length_penalty"],
                    policy_step,
                    behav_logprobs=r["completion_logprobs"],
                    temperature=r["temperature"],
                    group_std=std,
                )  # fmt: skip
                for r, c in zip(g, centred, strict=True)
            ]
        )
    return out, sum(r["reward"] for r in rows) / max(len(rows), 1)


def held_out(model, tok, cfg, n: int) -> float:
    """Greedy exact accuracy on the n problems `make run`'s check uses."""
    from swarmrl.apps.evaluate import greedy_scores
    from swarmrl.tasks.sources.task_source import TaskSource

    source = TaskSource(cfg.task, 0)
    tasks = [source.get("eval", i, cfg.curriculum.start_level) for i in range(n)]
    scores = greedy_scores(model, tok, tasks, cfg.sampling.max_new_tokens)
    return sum(r == 1.0 for _, r in scores) / n


def run_one(cfg, loss: str, correction: str, seed: int, steps: int, lag: int, n_eval: int,
            start: float) -> dict:  # fmt: skip
    import torch

    from swarmrl.inference.hf import HFBackend
    from swarmrl.inference.worker import build_rows
    from swarmrl.models.loading import load_model, load_tokenizer
    from swarmrl.protocol.assign import Assignment
    from swarmrl.protocol.sampler import SamplerState
    from swarmrl.protocol.seeds import derive_seed
    from swarmrl.tasks.sources.task_source import TaskSource
    from swarmrl.trainer import lora
    from swarmrl.trainer.advantages import scale_advantages
    from swarmrl.trainer.correction import mismatch_metrics
    from swarmrl.trainer.losses import advantage_scale
    from swarmrl.trainer.step import grpo_update, set_lr

    t0 = time.time()
    tc = cfg.trainer.model_copy(update={"loss": loss, "is_correction": correction})
    run = cfg.model_copy(update={"seed": seed, "trainer": tc})
    torch.manual_seed(seed)
    tok = load_tokenizer(cfg.model.path)
    policy = load_model(cfg.model.path)
    engine = HFBackend.around(copy.deepcopy(policy))
    if tc.lora.rank:  # adapters trained; workers run the merged weights
        policy = lora.wrap(policy, tc.lora)
    opt = torch.optim.AdamW(
        lora.trainable(policy), lr=tc.lr, betas=tc.betas, weight_decay=tc.weight_decay
    )
    source = TaskSource(cfg.task, seed)

    def weights() -> dict:
        state = lora.merged_state(policy) if tc.lora.rank else policy.state_dict()
        return {k: v.detach().clone() for k, v in state.items()}

    versions = {0: weights()}
    budget = tc.token_budget or tc.batch_groups * cfg.worker.group_size * (
        cfg.sampling.max_new_tokens
    )
    counter, rows_out, rewards = 0, [], []
    for step in range(1, steps + 1):
        v = max(0, step - lag)  # the policy_step of this step's files: staleness `lag`
        engine.model.load_state_dict(versions[v])
        groups: list = []
        for _ in range(64):  # files until the step has its groups with signal
            counter += 1
            a = Assignment(step=step, policy_step=v, seed=derive_seed(seed, "bench", counter),
                           counter=counter, sampler=SamplerState())  # fmt: skip
            got, mean = _samples(build_rows(run, tok, source, engine, a, "bench"), v)
            groups += got
            rewards.append(mean)
            if len(groups) >= tc.batch_groups:
                break
        samples = [s for g in groups[: tc.batch_groups] for s in g]
        scale_advantages(samples, advantage_scale(tc))
        set_lr(opt, tc, step)
        t_train = time.time()
        stats = grpo_update(policy, None, opt, samples, tc, budget, tok.pad_token_id,
                            top_p=cfg.sampling.top_p)  # fmt: skip
        versions[step] = weights()
        versions.pop(step - lag - 1, None)
        row = {"step": step, "entropy": stats.entropy, "clip_fraction": stats.clip_fraction,
               "train_s": time.time() - t_train,
               **mismatch_metrics(samples, stats.mismatch, step)}  # fmt: skip
        rows_out.append(row)
    engine.model.load_state_dict(versions[steps])  # what a worker would run
    final = held_out(engine.model, tok, cfg, n_eval)
    kls = [r["mismatch_kl"] for r in rows_out if "mismatch_kl" in r]
    return {
        "loss": loss, "correction": correction, "seed": seed, "steps": steps, "lag": lag,
        "start": start, "final": final, "entropy_end": rows_out[-1]["entropy"],
        "mismatch_kl": sum(kls) / max(len(kls), 1),
        "clip_fraction": sum(r["clip_fraction"] for r in rows_out) / len(rows_out),
        "trained_parameters": sum(p.numel() for p in lora.trainable(policy)),
        "train_s": sum(r["train_s"] for r in rows_out),
        "excluded": sum(r.get("is_excluded_fraction", 0.0) for r in rows_out) / len(rows_out),
        "sampled_reward_first": sum(rewards[:3]) / 3, "sampled_reward_last": rewards[-1],
        "files": counter, "seconds": time.time() - t0, "per_step": rows_out,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "default.toml"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lag", type=int, default=2)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--losses", default="grpo,dapo,dr_grpo,gspo,cispo")
    ap.add_argument("--corrections", default="token_tis")
    ap.add_argument("--eval", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. trainer.lr=1e-5")
    args = ap.parse_args()
    import torch

    from swarmrl.config import load_config
    from swarmrl.models.loading import load_model, load_tokenizer

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, args.overrides)
    start = held_out(load_model(cfg.model.path), load_tokenizer(cfg.model.path), cfg, args.eval)
    print(json.dumps({"start_accuracy": start, "eval": args.eval}), flush=True)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):  # every setting once, then again
        for loss in args.losses.split(","):
            for correction in args.corrections.split(","):
                res = run_one(cfg, loss, correction, seed, args.steps, args.lag, args.eval, start)
                res["settings"] = " ".join(args.overrides) or "defaults"
                print(json.dumps(res), flush=True)
                results.append(res)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(res) + "\n")
    print(table(results))


def table(results: list[dict]) -> str:
    lines = [
        "| loss | correction | settings | seed | held-out start → end | gain (points) "
        "| entropy at end | clipped | mismatch KL (mean) | excluded | s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['loss']} | {r['correction']} | {r.get('settings', '')} | {r['seed']} | "
            f"{r['start']:.3f} → {r['final']:.3f} | {100 * (r['final'] - r['start']):+.1f} | "
            f"{r['entropy_end']:.3f} | {r['clip_fraction']:.4f} | {r['mismatch_kl']:.4f} | "
            f"{r['excluded']:.4f} | "
            f"{r['seconds']:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
