"""Built-in generated tasks.

Problems are a pure function of (task, split, index, seed), so workers and
validators can recompute any prompt from its index without shipping a dataset.
The eval split draws from a separate seed stream. It is not de-duplicated
against train: with 26^3..26^8 texts and 10^(2d) sums a collision is rare, and
held-out accuracy is reported on that understanding.
"""

from __future__ import annotations

import hashlib
import random
import string

from swarmrl.config import TaskConfig
from swarmrl.tasks.schema import Task

SPLITS = {"train": 0, "eval": 1}


def _rng(seed: int, split: str, index: int, name: str) -> random.Random:
    key = f"{name}/{split}/{seed}/{index}".encode()
    return random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))


def reverse_text(cfg: TaskConfig, split: str, index: int, seed: int) -> Task:
    rng = _rng(seed, split, index, "reverse_text")
    n = rng.randint(cfg.min_len, cfg.max_len)
    text = "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
    return Task(
        problem_id=f"reverse_text/{split}/{index}",
        prompt=f"Reverse the text: {text}",
        task_type="reverse_text",
        verification_info={"answer": text[::-1]},
        metadata={"text": text},
    )


def addition(cfg: TaskConfig, split: str, index: int, seed: int) -> Task:
    rng = _rng(seed, split, index, "addition")
    lo, hi = 10 ** (cfg.digits - 1) if cfg.digits > 1 else 0, 10**cfg.digits - 1
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    return Task(
        problem_id=f"addition/{split}/{index}",
        prompt=f"What is {a} + {b}?",
        task_type="addition",
        verification_info={"answer": str(a + b)},
        metadata={"a": a, "b": b},
    )


GENERATORS = {"reverse_text": reverse_text, "addition": addition}


def answer_text(task: Task) -> str:
    """The reference completion used for the supervised warm start."""
    return str(task.verification_info["answer"])
