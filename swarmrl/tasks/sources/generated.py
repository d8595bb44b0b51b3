"""Built-in generated tasks.

Problems are a pure function of (task, split, index, seed, level), so workers
and validators can recompute any prompt from its index without shipping a
dataset. `level` is the difficulty knob the curriculum turns (tasks/curriculum.py):
level 0 is the configured range, and each level up makes every problem longer
by one unit: one more character to reverse (lengths [min_len + level,
max_len + level]), one more digit per operand. Problem ids name the level
above 0 (`reverse_text/train/L2/17`), so the same index at two levels is two
problems.
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


def _problem_id(name: str, split: str, index: int, level: int) -> str:
    return f"{name}/{split}/{index}" if level == 0 else f"{name}/{split}/L{level}/{index}"


def reverse_text(cfg: TaskConfig, split: str, index: int, seed: int, level: int = 0) -> Task:
    rng = _rng(seed, split, index, "reverse_text")
    n = rng.randint(cfg.min_len + level, cfg.max_len + level)
    text = "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
    return Task(
        problem_id=_problem_id("reverse_text", split, index, level),
        prompt=f"Reverse the text: {text}",
        task_type="reverse_text",
        verification_info={"answer": text[::-1]},
        metadata={"text": text},
    )


def addition(cfg: TaskConfig, split: str, index: int, seed: int, level: int = 0) -> Task:
    rng = _rng(seed, split, index, "addition")
    digits = cfg.digits + level
    lo, hi = 10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    return Task(
        problem_id=_problem_id("addition", split, index, level),
        prompt=f"What is {a} + {b}?",
        task_type="addition",
        verification_info={"answer": str(a + b)},
        metadata={"a": a, "b": b},
    )


def multiplication(cfg: TaskConfig, split: str, index: int, seed: int, level: int = 0) -> Task:
    """A product of a `digits`-digit and a (`digits` + 1)-digit number (2 and 3 by default
    with digits = 2: 4- and 5-digit products), beyond what a small model does in its
    head: the tool demo's task (envs/, issue 26)."""
    rng = _rng(seed, split, index, "multiplication")
    d = cfg.digits + level
    a = rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)
    b = rng.randint(10**d, 10 ** (d + 1) - 1)
    return Task(
        problem_id=_problem_id("multiplication", split, index, level),
        prompt=f"What is {a} * {b}?",
        task_type="multiplication",
        verification_info={"answer": str(a * b)},
        metadata={"a": a, "b": b},
    )


GENERATORS = {"reverse_text": reverse_text, "addition": addition, "multiplication": multiplication}


def max_level(cfg: TaskConfig, max_new_tokens: int) -> int:
    """The highest level whose longest answer (plus EOS) still fits in max_new_tokens
    for a character-level model; a guide for the curriculum's default cap."""
    if cfg.name == "reverse_text":
        longest = cfg.max_len
    elif cfg.name == "multiplication":
        longest = 2 * cfg.digits + 1
    else:
        longest = cfg.digits + 1
    return max(0, max_new_tokens - 1 - longest)


def answer_text(task: Task) -> str:
    """The reference completion used for the supervised warm start."""
    return str(task.verification_info["answer"])


def describe_level(cfg: TaskConfig, level: int) -> str:
    """What a generated task's problems are at `level`, in words ("2-digit sums")."""
    if cfg.name == "addition":
        return f"{cfg.digits + level}-digit sums"
    if cfg.name == "multiplication":
        d = cfg.digits + level
        return f"products of {d}- and {d + 1}-digit numbers"
    if cfg.name == "reverse_text":
        return f"reversals of {cfg.min_len + level}-{cfg.max_len + level} characters"
    return f"{cfg.name} problems at level {level}"
