"""`swarmrl eval`: greedy accuracy and mean reward on held-out problems.

Greedy decoding (argmax) on the eval split, at a fixed difficulty level of
generated tasks (0 by default: the run's starting difficulty, whatever level
the curriculum reached). Accuracy counts completions with task reward 1.0
(exact reversal, exact sum); mean reward averages the task reward. Prompts are
batched with left padding and decoded by the workers' loop
(inference/generation.py), which stops a completion at any of the model's EOS
ids; the argmax is taken over the raw logits (the model's generation_config,
e.g. a repetition penalty, is not applied).

With a target length T (`swarmrl eval --target-length T`), every prompt
carries the thinking-budget instruction for T tokens, as in training, and the
report adds how closely completion lengths follow it (`budget_report`): mean
and median tokens, mean absolute and relative error, the fractions within 10%
and 25% of T, over T, and cut at the length limit, and the mean length
penalty under the run's `length_reward` mode.
"""

from __future__ import annotations

import time

from swarmrl.config import TaskConfig


def greedy_scores(
    model, tokenizer, tasks, max_new_tokens: int, batch: int = 64, target_length: int = 0
) -> list[tuple[str, float]]:
    """Greedy completion and task reward for each task (left-padded batches); with
    `target_length`, the prompt carries the thinking-budget instruction."""
    return [
        (text, r)
        for text, r, _, _ in _greedy(model, tokenizer, tasks, max_new_tokens, batch, target_length)
    ]


def _greedy(model, tokenizer, tasks, max_new_tokens: int, batch: int, target_length: int,
            on_batch=None, env=None):  # fmt: skip
    """(completion text, task reward, tokens before EOS, tool answers that are not
    errors) for each task; `on_batch(k)` after each batch of k tasks. With an
    environment `env`, greedy trajectories (the tool answers between the model's
    spans) graded on their whole text."""
    from swarmrl.envs.environment import bound
    from swarmrl.inference.generation import decode, greedy
    from swarmrl.inference.hf import HFBackend
    from swarmrl.inference.trajectory import generate_trajectories
    from swarmrl.models.prompting import (
        decode_completion,
        encode_prompt,
        model_replies,
        prompt_text,
    )
    from swarmrl.tasks.graders.registry import verify

    eos = model.config.eos_token_id
    eos = list(dict.fromkeys(eos if isinstance(eos, list) else [eos]))
    out_scores = []
    for s in range(0, len(tasks), batch):
        chunk = tasks[s : s + batch]
        prompts = [encode_prompt(tokenizer, prompt_text(t.prompt, target_length)) for t in chunk]
        if env is None:
            done = decode(model, prompts, max_new_tokens, greedy, eos, tokenizer.pad_token_id)
        else:
            done = generate_trajectories(
                HFBackend.around(model), tokenizer, bound(env, chunk), prompts, [0] * len(prompts),
                max_new_tokens, 1.0, 1.0, proofs=False, greedy=True,
            )  # fmt: skip
        for t, c in zip(chunk, done, strict=True):
            cut = len(c.tokens) - c.finished  # the EOS token is not part of the text
            text = decode_completion(tokenizer, c.tokens[:cut])
            replies = model_replies(tokenizer, c.tokens, getattr(c, "mask", None))
            score = verify(t, text, replies)
            out_scores.append((text, score, cut, _answered_calls(tokenizer, c)))
        if on_batch is not None:
            on_batch(len(chunk))
    return out_scores


def _answered_calls(tokenizer, c) -> int:
    """Environment spans of a trajectory that are not an error (0 for a completion)."""
    from swarmrl.protocol.rollouts import spans

    mask = getattr(c, "mask", None) or [1] * len(c.tokens)
    answers = [tokenizer.decode(c.tokens[a:b]) for a, b, model in spans(mask) if not model]
    return sum("error" not in x for x in answers)


def default_max_new_tokens(task_name: str, target_length: int) -> int:
    """Enough new tokens for an answer of the task (16 for reverse_text, else 24), and
    twice the thinking budget when one is given."""
    return max(16 if task_name == "reverse_text" else 24, 2 * target_length)


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
    target_length: int = 0,
    length_mode: str = "exact",
    length_coef: float = 0.0003,
    on_batch=None,
    env=None,
) -> dict:
    """Greedy accuracy and mean task reward of `model_path` on `n` problems of the eval
    split at difficulty `level`; `on_batch(k)` is called as each batch of k is scored.
    `env`: the run's environment (envs/environment.py), whose tool answers between the
    model's spans as in training."""
    import torch

    from swarmrl.models.loading import load_model, load_tokenizer
    from swarmrl.models.prompting import prompt_text
    from swarmrl.tasks.sources.task_source import TaskSource

    torch.set_num_threads(threads)
    t0 = time.time()
    tok = load_tokenizer(model_path)
    model = load_model(model_path, dtype)
    source = TaskSource(task_cfg, seed)
    tasks = [source.get("eval", i, level) for i in range(n)]
    scores = _greedy(model, tok, tasks, max_new_tokens, batch, target_length, on_batch, env)
    rewards = [r for _, r, _, _ in scores]
    samples = [
        {
            "prompt": prompt_text(t.prompt, target_length),
            "completion": text,
            "reward": r,
            "tokens": k,
        }  # fmt: skip
        for t, (text, r, k, _) in zip(tasks[:5], scores[:5], strict=True)
    ]
    out = {
        "model": model_path,
        "task": task_cfg.name,
        "level": level,
        "n": n,
        "accuracy": sum(r == 1.0 for r in rewards) / n,
        "mean_reward": sum(rewards) / n,
        "seconds": time.time() - t0,
        "samples": samples,
    }
    if env is not None:  # trajectories in which the tool answered (without an error)
        out["tool_use"] = sum(calls > 0 for *_, calls in scores) / n
    if target_length:
        out["budget"] = budget_report(
            [k for _, _, k, _ in scores], target_length, max_new_tokens, length_mode, length_coef
        )
    return out


def budget_report(
    lengths: list[int], target: int, max_new_tokens: int, mode: str, coef: float
) -> dict:
    """How closely completions of `lengths` tokens follow a budget of `target` tokens."""
    from swarmrl.tasks.length import length_penalty

    n = len(lengths)
    errors = [abs(k - target) for k in lengths]
    return {
        "target": target,
        "mean_tokens": sum(lengths) / n,
        "median_tokens": sorted(lengths)[n // 2],
        "mean_abs_error": sum(errors) / n,
        "mean_rel_error": sum(errors) / n / target,
        "within_10pct": sum(e <= 0.1 * target for e in errors) / n,
        "within_25pct": sum(e <= 0.25 * target for e in errors) / n,
        "over_budget": sum(k > target for k in lengths) / n,
        "hit_limit": sum(k >= max_new_tokens for k in lengths) / n,
        "mode": mode,
        "mean_penalty": sum(length_penalty(mode, k, target, coef) for k in lengths) / n,
    }


def text_report(res: dict) -> str:
    """`evaluate`'s result as `swarmrl eval` prints it without --json."""
    lines = [
        f"{res['model']} on {res['task']} (n={res['n']}): accuracy {res['accuracy']:.3f}, "
        f"mean reward {res['mean_reward']:.3f} ({res['seconds']:.1f}s)"
    ]
    if "budget" in res:
        b = res["budget"]
        lines.append(
            f"budget {b['target']} tokens: mean {b['mean_tokens']:.1f}, median "
            f"{b['median_tokens']}, mean |error| {b['mean_abs_error']:.1f} "
            f"({100 * b['mean_rel_error']:.0f}%), within 10% {b['within_10pct']:.2f}, "
            f"within 25% {b['within_25pct']:.2f}, over {b['over_budget']:.2f}, "
            f"mean {b['mode']} penalty {b['mean_penalty']:.3f}"
        )
    return "\n".join(lines)
