"""Dishonest workers of multi-turn runs (`[env]`): each games the environment's part
of a trajectory in one way, and the validator must catch it by that one thing.

- forged-tool-result: generates with an environment that writes results the tool
  did not give (every digit moved by one, or a character added), and lets the
  model go on from them: the proofs and sampling hold for the forged context,
  the validator's replay of the tool does not (check `environment`);
- dropped-turn: generates honestly, then cuts each trajectory before its last
  tool answer and proves and scores the rest honestly: the trajectory stops
  where the environment answers (check `environment`);
- edited-after-tool: generates honestly, then changes one token of its first
  model span after the tool answered, writes what the tool answers the edited
  span, and proves and scores it all honestly: the environment check passes,
  the edited token is not the seeded choice (check `sampling`);
- loose-tool-limits: runs the tools with limits far looser than the run's
  (`[env]` max_digits and the rest, the Python tool's memory and CPU), so a call
  the run's tools refuse gets a value: the validator's replay, with the run's
  limits, answers an error (check `environment`; `unverifiable` where the run's
  answer is the Python tool's time limit, which speeds could explain).

In a single-turn run every one of them is an honest worker.
"""

from __future__ import annotations

from swarmrl.envs.environment import ToolEnvironment, bound, environment_of
from swarmrl.envs.python_tool import PythonLimits
from swarmrl.envs.tools import CalcLimits
from swarmrl.inference import worker
from swarmrl.inference.generation import Completion
from swarmrl.inference.trajectory import env_ids
from swarmrl.protocol.rollouts import spans
from swarmrl.sim.cheats import Cheat, prove_by_prefill

LOOSE = CalcLimits(max_expr_chars=100_000, max_digits=100_000, max_exponent=100_000)


def forge(answer: str) -> str:
    """An answer the tool did not give: each digit moved by one, or, with no digit, a
    character added before the last."""
    moved = "".join(str((int(c) + 1) % 10) if c.isdigit() else c for c in answer)
    return moved if moved != answer else answer[:-1] + "?" + answer[-1:]


class _Lying:
    """An environment that ends spans as `env` does and answers what it would not."""

    def __init__(self, env):
        self.env = env

    def ends(self, span: str) -> bool:
        return self.env.ends(span)

    def respond(self, span: str, turn: int) -> str | None:
        answer = self.env.respond(span, turn)
        return None if answer is None else forge(answer)

    def bind(self, task) -> _Lying:
        """Lying about a verifiers taskset's tools too (they answer per task)."""
        return _Lying(bound(self.env, [task])[0])


class ForgedToolResult(Cheat):
    name = "forged-tool-result"

    def complete(self, cfg, backend, plan, tokenizer=None):
        env = environment_of(cfg)
        lying = None if env is None else _Lying(env)
        return worker.complete_with(cfg, backend, plan, tokenizer, lying)


def loosened(env: ToolEnvironment) -> ToolEnvironment:
    """`env` with the tools' limits far looser than the run's."""
    python = PythonLimits(cpu_s=60, memory_mb=16_384, isolation=env.python.isolation)
    return ToolEnvironment(env.tools, env.max_turns, env.syntax, LOOSE, python)


class LooseToolLimits(Cheat):
    name = "loose-tool-limits"

    def complete(self, cfg, backend, plan, tokenizer=None):
        env = environment_of(cfg)
        if isinstance(env, ToolEnvironment):
            env = loosened(env)
        return worker.complete_with(cfg, backend, plan, tokenizer, env)


def _rescored(cfg, tokenizer, backend, plan, r: dict, c: Completion) -> dict:
    """Row `r` with completion `c` in place of its own, proved by one honest prefill
    and scored honestly (the cheat shows nowhere else)."""
    (proved,) = prove_by_prefill(backend, [r["prompt_tokens"]], [c.tokens])
    c.proofs = proved.proofs
    p = plan[r["group"]]
    j = p.seeds.index(r["seed"])
    return r | worker.score_row(cfg, tokenizer, p, r["group"], j, c)


class DroppedTurn(Cheat):
    name = "dropped-turn"

    def tamper(self, cfg, tokenizer, backend, plan, rows):
        out = []
        for r in rows:
            parts = spans(r["completion_mask"])
            if len(parts) < 3:
                out.append(r)
                continue
            cut = parts[-2][0]  # where the last environment span starts
            c = Completion(
                r["completion_tokens"][:cut], r["completion_logprobs"][:cut], False,
                mask=r["completion_mask"][:cut],
            )  # fmt: skip
            out.append(_rescored(cfg, tokenizer, backend, plan, r, c))
        return out


class EditedAfterTool(Cheat):
    name = "edited-after-tool"

    def tamper(self, cfg, tokenizer, backend, plan, rows):
        env = environment_of(cfg)
        out = []
        for r in rows:
            parts = spans(r["completion_mask"])
            if env is None or len(parts) < 3:
                out.append(r)
                continue
            row_env = bound(env, [plan[r["group"]].task])[0]
            tokens = list(r["completion_tokens"])
            _, end, _ = parts[0]
            tokens[0] = _other_token(tokenizer, tokens[0])

            def text(ids):
                return tokenizer.decode(ids, skip_special_tokens=True)

            answer = row_env.respond(text(tokens[:end]), 0)
            if answer is None or any(row_env.ends(text(tokens[:i])) for i in range(1, end)):
                out.append(r)  # the edit moved or took away the call: nothing to pass off
                continue
            ids = env_ids(row_env, tokenizer, answer)
            e0, e1, _ = parts[1]
            tokens = tokens[:e0] + ids + tokens[e1:]
            logprobs = r["completion_logprobs"][:e0] + [0.0] * len(ids)
            logprobs += r["completion_logprobs"][e1:]
            mask = r["completion_mask"][:e0] + [0] * len(ids) + r["completion_mask"][e1:]
            c = Completion(tokens, logprobs, r["completion_tokens"][-1] == tokens[-1], mask=mask)
            out.append(_rescored(cfg, tokenizer, backend, plan, r, c))
        return out


def _other_token(tokenizer, token: int) -> int:
    """Another ordinary token in place of `token`: the next digit for a digit, else 'a'
    or 'b'."""
    text = tokenizer.decode([token])
    if len(text) == 1 and text.isdigit():
        swap = str((int(text) + 1) % 10)
    else:
        swap = "b" if text == "a" else "a"
    return tokenizer(swap, add_special_tokens=False)["input_ids"][0]


TOOL_CHEATS = (ForgedToolResult, DroppedTurn, EditedAfterTool, LooseToolLimits)
