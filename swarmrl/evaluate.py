"""`swarmrl eval`: greedy accuracy and mean reward on held-out problems.

Greedy decoding (argmax) on the eval split. Accuracy counts completions with
task reward 1.0 (exact reversal, exact sum); mean reward averages the task
reward. Prompts are batched with left padding.
"""

from __future__ import annotations

import time

from swarmrl.config import TaskConfig


def evaluate(
    model_path: str,
    task_cfg: TaskConfig,
    n: int,
    max_new_tokens: int,
    seed: int = 0,
    batch: int = 64,
    threads: int = 2,
    dtype: str = "float32",
) -> dict:
    import torch

    from swarmrl.models.loading import load_model, load_tokenizer
    from swarmrl.models.prompting import decode_completion, encode_prompt
    from swarmrl.tasks.dataset import TaskSource
    from swarmrl.tasks.verifiers import verify

    torch.set_num_threads(threads)
    t0 = time.time()
    tok = load_tokenizer(model_path)
    model = load_model(model_path, dtype)
    source = TaskSource(task_cfg, seed)
    tasks = [source.get("eval", i) for i in range(n)]
    eos = model.config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    rewards = []
    samples = []
    for s in range(0, n, batch):
        chunk = tasks[s : s + batch]
        prompts = [encode_prompt(tok, t.prompt) for t in chunk]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=attn,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=list(eos),
            )
        for t, row in zip(chunk, out[:, width:].tolist(), strict=True):
            cut = next((i for i, x in enumerate(row) if x in eos), len(row))
            text = decode_completion(tok, row[:cut])
            r = verify(t, text)
            rewards.append(r)
            if len(samples) < 5:
                samples.append({"prompt": t.prompt, "completion": text, "reward": r})
    return {
        "model": model_path,
        "task": task_cfg.name,
        "n": n,
        "accuracy": sum(r == 1.0 for r in rewards) / n,
        "mean_reward": sum(rewards) / n,
        "seconds": time.time() - t0,
        "samples": samples,
    }
