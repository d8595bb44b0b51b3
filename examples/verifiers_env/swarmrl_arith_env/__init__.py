"""A single-turn verifiers taskset: two-number arithmetic with a checked answer.

Install it (`pip install examples/verifiers_env`) or put this directory on
PYTHONPATH, then run swarmrl with `task.name = "verifiers"` and
`task.env = "swarmrl-arith-env"`. Its config takes `count` (rows) and `seed`.
Reward: 1 for the right number as the last number of the reply; a metric
records the reply's length.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

SYSTEM = "Answer with the number only."


class ArithData(vf.TaskData):
    answer: int


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = re.findall(r"-?\d+", trace.last_reply or "")
        return 1.0 if found and int(found[-1]) == self.data.answer else 0.0

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply or ""))


class ArithConfig(vf.TasksetConfig):
    count: int = 200
    seed: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        rows = []
        for i in range(self.config.count):
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            op = rng.choice("+-*")
            answer = {"+": a + b, "-": a - b, "*": a * b}[op]
            data = ArithData(
                id=f"arith-{i}",
                prompt=f"What is {a} {op} {b}?",
                system_prompt=SYSTEM,
                answer=answer,
            )
            rows.append(ArithTask(data, self.config.task))
        return rows


__all__ = ["ArithTaskset"]
