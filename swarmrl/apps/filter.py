"""`swarmrl filter`: keep the tasks a model solves sometimes, not always, not never.

INTELLECT-2 filtered its training tasks offline by how often the base model
solved them: tasks solved every time teach nothing (every sample of a group
gets the same reward, so GRPO's advantages are zero), nor do tasks never
solved. This samples each task of a task file `samples` times at the given
temperature, records its solve rate (the fraction of samples whose task
reward is 1.0, by the task's own verifier) and keeps the tasks whose rate lies
in [min_solve_rate, max_solve_rate].

Output: OUT (JSONL) holds the kept records, each with `metadata.solve_rate`;
OUT + ".progress.jsonl" holds one line per task done, kept or not
(`problem_id`, `solve_rate`, `kept`). Both are appended a task at a time and
flushed, so a run that is killed continues where it stopped when started
again with the same arguments: tasks already in the progress file are not
sampled again, and a torn last line (the kill came mid-write) is dropped
from both files before continuing. Tasks are told apart by `problem_id`, so
ids must be unique in the input.

Sampling draws as transformers' `generate(do_sample=True)` draws (temperature,
the model's top-k, 50 when its generation_config sets none, top-p, then
`torch.multinomial`), seeded per task from `seed` and the task's id, so a
rerun of a task draws the same samples on the same machine. It is a filter,
not a checkable rollout, so it does not use the worker's Gumbel-max sampler;
it does use the workers' decoding loop (inference/generation.py) and its EOS
rule (a completion ends at any of the model's EOS ids). Other sampling
settings a generation_config may carry (repetition penalty, min-p...) are not
applied.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from swarmrl.errors import UserError
from swarmrl.tasks.schema import TaskError
from swarmrl.tasks.sources.task_source import load_task_file

GENERATE_TOP_K = 50  # transformers' top-k when a model's generation_config sets none


class FilterError(UserError, ValueError):
    """Bad arguments or files; the message names the problem."""


def _read_lines(path: Path) -> list[dict]:
    """The complete JSON lines of `path`; a torn last line is cut off the file."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    good_end, out = 0, []
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
        good_end += len(line)
    if good_end != len(raw):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return out


def _task_seed(seed: int, problem_id: str) -> int:
    digest = hashlib.sha256(f"filter/{seed}/{problem_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def multinomial(temperature: float, top_p: float, top_k: int | None):
    """A token choice for `decode` that samples as transformers' `generate` does with
    do_sample: its temperature, top-k and top-p warpers in that order, then
    `torch.multinomial` over the softmax (torch's global generator)."""
    import torch
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p))

    def choose(logits, step: int):
        scores = logits.to(copy=True, dtype=torch.float32)
        for w in warpers:
            scores = w(None, scores)
        probs = torch.softmax(scores, dim=-1)
        token = torch.multinomial(probs, num_samples=1).squeeze(1)
        return token, torch.log(probs.gather(-1, token[:, None]).squeeze(-1))

    return choose


def solve_rate(model, tokenizer, task, samples: int, max_new_tokens: int, temperature: float,
               top_p: float, seed: int) -> float:  # fmt: skip
    """The fraction of `samples` sampled completions with task reward 1.0."""
    import torch

    from swarmrl.inference.generation import decode
    from swarmrl.models.prompting import decode_completion, encode_prompt
    from swarmrl.tasks.graders.registry import verify

    prompt = encode_prompt(tokenizer, task.prompt)
    eos = model.config.eos_token_id
    eos = list(eos) if isinstance(eos, list) else [eos]
    top_k = model.generation_config.top_k
    choose = multinomial(temperature, top_p, GENERATE_TOP_K if top_k is None else top_k)
    torch.manual_seed(_task_seed(seed, task.problem_id))
    done = decode(model, [prompt] * samples, max_new_tokens, choose, eos,
                  tokenizer.pad_token_id or eos[0], share_prompts=True)  # fmt: skip
    solved = 0
    for c in done:
        cut = len(c.tokens) - c.finished  # the EOS token is not part of the text
        solved += verify(task, decode_completion(tokenizer, c.tokens[:cut])) == 1.0
    return solved / samples


def run_filter(
    model_path: str,
    data: Path,
    out: Path,
    samples: int = 8,
    max_solve_rate: float = 0.75,
    min_solve_rate: float = 0.0,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    threads: int = 2,
    show_progress: bool = True,
) -> dict:
    if not 0.0 <= min_solve_rate <= max_solve_rate <= 1.0:
        raise FilterError(
            f"need 0 <= --min-solve-rate ({min_solve_rate}) <= --max-solve-rate "
            f"({max_solve_rate}) <= 1"
        )
    if samples < 1:
        raise FilterError("--samples must be at least 1")
    if out.suffix != ".jsonl":
        raise FilterError(f"--out {out}: the output is a JSONL task file (name it *.jsonl)")
    try:
        tasks = load_task_file(data)
    except TaskError as e:
        raise FilterError(str(e)) from None
    ids = [t.problem_id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise FilterError(f"{data}: problem_id '{dup}' appears more than once (ids must be unique)")
    progress_path = out.with_name(out.name + ".progress.jsonl")
    done = {r["problem_id"]: r for r in _read_lines(progress_path)}
    kept_ids = {r["problem_id"] for r in _read_lines(out)}
    # A kill between the two appends leaves a task kept in OUT but not in the progress
    # file: it is sampled again, and its earlier copy is dropped so it is kept once.
    stray = kept_ids - {i for i, r in done.items() if r["kept"]}
    if stray:
        rows = [r for r in _read_lines(out) if r["problem_id"] not in stray]
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))

    import torch
    from tqdm import tqdm

    from swarmrl.models.loading import load_model, load_tokenizer

    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path)
    todo = [t for t in tasks if t.problem_id not in done]
    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), unit="task",
               desc="filter", disable=not show_progress)  # fmt: skip
    with open(out, "a") as kept_f, open(progress_path, "a") as prog_f:
        for task in todo:
            rate = solve_rate(model, tokenizer, task, samples, max_new_tokens, temperature,
                              top_p, seed)  # fmt: skip
            keep = min_solve_rate <= rate <= max_solve_rate
            if keep:
                record = task.model_dump()
                record["metadata"] = {**record["metadata"], "solve_rate": rate}
                kept_f.write(json.dumps(record) + "\n")
                kept_f.flush()
                os.fsync(kept_f.fileno())
            prog_f.write(json.dumps({"problem_id": task.problem_id, "solve_rate": rate, "kept": keep}) + "\n")  # fmt: skip
            prog_f.flush()
            os.fsync(prog_f.fileno())
            done[task.problem_id] = {"solve_rate": rate, "kept": keep}
            bar.update(1)
            bar.set_postfix(kept=sum(r["kept"] for r in done.values()))
    bar.close()
    rates = [r["solve_rate"] for r in done.values()]
    return {
        "tasks": len(tasks),
        "sampled_now": len(todo),
        "kept": sum(r["kept"] for r in done.values()),
        "mean_solve_rate": sum(rates) / len(rates),
        "out": str(out),
        "progress": str(progress_path),
    }
