"""Trainer step time with shared prompts beside the packed forward.

One GRPO update (`grpo_update`: forward, backward, clip, AdamW) on a batch of
groups whose samples share their prompt, as every GRPO batch does: once with
`trainer.share_prompts = false` (the peer: every sample runs prompt +
completion, the usual packed forward) and once with it on (each prompt runs
once per micro-batch and the completions on its cached keys and values). The
two alternate `--repeat` times on the same weights and batch; the JSON gives
median seconds per step, tokens run through the model, and the ratio.

The batch: the prompts of a config's task, built with its chat template and
instruction as a worker builds them, and random completions of a fixed length
(the step's cost does not depend on what the tokens are).

    .venv/bin/python bench/trainer_step.py [--config configs/smollm2-addition.toml]
        [--groups 8] [--completion 12] [--threads 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _batch(cfg, tok, groups: int, completion: int, seed: int):
    from swarmrl.models.prompting import encode_prompt, prompt_text
    from swarmrl.tasks.sources.task_source import TaskSource
    from swarmrl.trainer.batch import Sample

    source = TaskSource(cfg.task, cfg.seed)
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = encode_prompt(tok, prompt_text(source.get("train", g).prompt))
        for _ in range(cfg.worker.group_size):
            comp = [rng.randrange(100, 1000) for _ in range(completion)]
            out.append(Sample(prompt, comp, rng.uniform(-1, 1), 0.0, 0.0, 0.0, 0))
    return out


def _step(model, samples, tcfg, pad_id) -> float:
    import torch

    from swarmrl.trainer.step import grpo_update

    opt = torch.optim.AdamW(model.parameters(), lr=1e-12)  # the update itself is measured
    t = time.perf_counter()
    grpo_update(model, None, opt, samples, tcfg, float(len(samples) * 16), pad_id)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs/smollm2-addition.toml"))
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--completion", type=int, default=12, help="tokens per completion")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from swarmrl.config import load_config
    from swarmrl.models.loading import load_model, load_tokenizer

    torch.set_num_threads(args.threads)
    cfg = load_config(Path(args.config))
    tok = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path)
    samples = _batch(cfg, tok, args.groups, args.completion, cfg.seed)
    prompt_len = statistics.mean(len(s.prompt_tokens) for s in samples)
    times: dict[str, list[float]] = {"packed": [], "shared": []}
    for _ in range(args.repeat):
        for name, share in (("packed", False), ("shared", True)):
            tcfg = copy.deepcopy(cfg.trainer)
            tcfg.share_prompts = share
            times[name].append(_step(model, samples, tcfg, tok.pad_token_id))
    n, g = len(samples), cfg.worker.group_size
    result = {
        "config": args.config,
        "model": cfg.model.path,
        "threads": args.threads,
        "samples": n,
        "group_size": g,
        "micro_batch": cfg.trainer.micro_batch,
        "prompt_tokens_mean": round(prompt_len, 1),
        "completion_tokens": args.completion,
        "tokens_packed": round(n * (prompt_len + args.completion)),
        "tokens_shared": round(n / g * prompt_len + n * args.completion),
        "step_s_packed": round(statistics.median(times["packed"]), 3),
        "step_s_shared": round(statistics.median(times["shared"]), 3),
        "all_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
    }
    result["speedup"] = round(result["step_s_packed"] / result["step_s_shared"], 2)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
