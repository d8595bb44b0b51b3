"""Graders of the built-in text tasks.

`reverse_text` is graded: 1 − Levenshtein(completion, answer) / max(len). A
first version used difflib's ratio 2·M/(|a|+|b|), and the tiny policy learned
to game it with short partial answers ("irpr" for "iportrx" scored 0.55); edit
distance charges every missing character.

`addition` is exact: the last integer in the completion must be the sum.
Taking the last integer lets chat models that answer "The answer is 579." be
scored too; a completion listing many numbers is still scored on its last one
only, which is the documented rule, not a loophole worth more than 0.
"""

from __future__ import annotations

import re

from swarmrl.tasks.schema import Task


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def score_reverse_text(task: Task, completion: str) -> float:
    target = str(task.verification_info["answer"])
    got = completion.strip()
    longest = max(len(got), len(target))
    if longest == 0:
        return 1.0
    return 1.0 - levenshtein(got, target) / longest


_INT = re.compile(r"-?\d[\d,]*")


def score_addition(task: Task, completion: str) -> float:
    found = _INT.findall(completion)
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "") == str(task.verification_info["answer"]) else 0.0
