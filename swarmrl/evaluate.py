"""`swarmrl eval`: greedy accuracy and mean reward on held-out problems.

Greedy decoding (argmax) on the eval split, at a fixed difficulty level of
generated tasks (0 by default: the run's starting difficulty, whatever level
the curriculum reached). Accuracy counts completions with task reward 1.0
(exact reversal, exact sum); mean reward averages the task reward. Prompts are
batched with left padding.
"""

from __future__ import annotations

import time

from swarmrl.config import TaskConfig


def greedy_scores(
    model, tokenizer, tasks, max_new_tokens: int, batch: int = 64
) -> list[tuple[str, float]]:
    """Greedy completion and task reward for each task (left-padded batches)."""
    import torch

    from swarmrl.models.prompting import decode_completion, encode_prompt
    from swarmrl.tasks.verifiers import verify

    eos = model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    pad = tokenizer.pad_token_id
    out_scores = []
    for s in range(0, len(tasks), batch):
        chunk = tasks[s : s + batch]
        prompts = [encode_prompt(tokenizer, t.prompt) for t in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens,
                do_sample=False, pad_token_id=pad, eos_token_id=list(eos),
            )  # fmt: skip
        for t, row in zip(chunk, out[:, width:].tolist(), strict=True):
            cut = next((i for i, x in enumerate(row) if x in eos), len(row))
            text = decode_completion(tokenizer, row[:cut])
            out_scores.append((text, verify(t, text)))
    return out_scores


def evaluate(
    model_path: str,
    task_cfg: TaskConfig,
    n: int,
    max_new_tokens: int,
    seed: int = 0,
    batch: int = 64,
    threads: int = 2,
    dtype: str = "float32",
    level: int = 0,
) -> dict:
    import torch

    from swarmrl.models.loading import load_model, load_tokenizer
    from swarmrl.tasks.dataset import TaskSource

    torch.set_num_threads(threads)
    t0 = time.time()
    tok = load_tokenizer(model_path)
    model = load_model(model_path, dtype)
    source = TaskSource(task_cfg, seed)
    tasks = [source.get("eval", i, level) for i in range(n)]
    scores = greedy_scores(model, tok, tasks, max_new_tokens, batch)
    rewards = [r for _, r in scores]
    samples = [
        {"prompt": t.prompt, "completion": text, "reward": r}
        for t, (text, r) in zip(tasks[:5], scores[:5], strict=True)
    ]
    return {
        "model": model_path,
        "task": task_cfg.name,
        "level": level,
        "n": n,
        "accuracy": sum(r == 1.0 for r in rewards) / n,
        "mean_reward": sum(rewards) / n,
        "seconds": time.time() - t0,
        "samples": samples,
    }
