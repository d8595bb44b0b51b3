"""A verifiers taskset whose tasks have tools: products of a 2-digit and a
3-digit number, with a calculator the model may call.

Run swarmrl with `task.name = "verifiers"`, `task.env = "swarmrl-tools-env"` and
`[env] kind = "verifiers"` (docs/multi-turn.md). The model calls the tool by
writing `<tool_call>{"name": "multiply", "arguments": {"a": 47, "b": 382}}</tool_call>`.

The toolset is stateful, per trajectory: it counts its calls and keeps the
products it computed, which the rewards read as `trace.state`. Config: `count`
(rows), `seed`, and `require_tool` (the reward is 1 only when the answer is a
product the tool computed in this trajectory).
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf


class CalcState(vf.State):
    calls: int = 0
    products: list[int] = []


class Calculator(vf.Toolset[vf.ToolsetConfig, CalcState]):
    TOOL_PREFIX = None  # the model sees the tool names bare

    @vf.tool
    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers."""
        self.state.calls += 1
        self.state.products.append(a * b)
        return str(a * b)

    @vf.tool
    def calls_so_far(self) -> int:
        """How many times multiply was called in this conversation."""
        return self.state.calls


class ProductData(vf.TaskData):
    answer: int


class ProductConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()
    require_tool: bool = False


class ProductTask(vf.Task[ProductData, CalcState, ProductConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Calculator(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        found = re.findall(r"-?\d+", trace.last_reply or "")
        if not found or int(found[-1]) != self.data.answer:
            return 0.0
        if self.config.require_tool and self.data.answer not in trace.state.products:
            return 0.0
        return 1.0

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(trace.state.calls)


class ProductTasksetConfig(vf.TasksetConfig):
    task: ProductConfig = ProductConfig()
    count: int = 200
    seed: int = 0


class ProductTaskset(vf.Taskset[ProductTask, ProductTasksetConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        rows = []
        for i in range(self.config.count):
            a, b = rng.randint(10, 99), rng.randint(100, 999)
            data = ProductData(
                id=f"product-{i}",
                prompt=f"What is {a} * {b}? End with the number.",
                answer=a * b,
            )
            rows.append(ProductTask(data, self.config.task))
        return rows


__all__ = ["ProductTaskset"]
