"""The rows of one rollout file, as an honest worker makes them: a chain of public
steps, `with_budget` (the node's length budget), `plan_prompts`, `complete`
(`complete_with` for a given environment) and `score_rows` (`score_row` per
sample); `build_rows` chains them. inference/worker.py writes, uploads and
submits the rows; the simulated workers of `swarmrl/sim/` redo all but one step
honestly, and the benches build files with `build_rows`.
"""

from __future__ import annotations

from swarmrl.config import RunConfig
from swarmrl.envs.environment import bound, environment_of
from swarmrl.inference.generation import Completion
from swarmrl.inference.trajectory import generate_trajectories
from swarmrl.models.prompting import decode_completion, model_replies
from swarmrl.protocol.assign import Assignment
from swarmrl.protocol.prompts import AssignedPrompt, assigned_prompts
from swarmrl.protocol.sampler import SamplerState
from swarmrl.tasks.graders.registry import verify
from swarmrl.tasks.length import length_penalty
from swarmrl.tasks.sources.task_source import TaskSource


def with_budget(cfg: RunConfig, a: Assignment) -> RunConfig:
    """`cfg` with the node's length budget of the assignment as `sampling.max_new_tokens`."""
    if a.max_new_tokens and a.max_new_tokens != cfg.sampling.max_new_tokens:
        return cfg.model_copy(
            update={
                "sampling": cfg.sampling.model_copy(update={"max_new_tokens": a.max_new_tokens})
            }
        )
    return cfg


def plan_prompts(cfg: RunConfig, source, tokenizer, a: Assignment) -> list[AssignedPrompt]:
    """The assignment's prompts and their sampling seeds, one `AssignedPrompt` per group."""
    return assigned_prompts(cfg, source, tokenizer, a.seed, a.sampler or SamplerState())


def complete(
    cfg: RunConfig, backend, plan: list[AssignedPrompt], tokenizer=None
) -> list[Completion]:
    """One completion per sample, flat, group after group: a trajectory of model and
    environment spans (`Completion.mask`) when the run has an environment ([env]),
    which needs the tokenizer to read the model's spans and write the answers."""
    return complete_with(cfg, backend, plan, tokenizer, environment_of(cfg))


def complete_with(cfg: RunConfig, backend, plan, tokenizer, env) -> list[Completion]:
    """`complete` with a given environment (None: single turn)."""
    s = cfg.sampling
    prompts = [p.tokens for p in plan for _ in p.seeds]
    seeds = [seed for p in plan for seed in p.seeds]
    if env is None:
        return backend.generate(prompts, seeds, s.max_new_tokens, s.temperature, s.top_p)
    if tokenizer is None:
        raise ValueError("a multi-turn completion needs the tokenizer")
    envs = bound(env, [p.task for p in plan for _ in p.seeds])
    made = generate_trajectories(
        backend, tokenizer, envs, prompts, seeds, s.max_new_tokens, s.temperature, s.top_p
    )
    return [Completion(t.tokens, t.logprobs, t.finished, t.proofs, t.mask) for t in made]


def score_row(cfg: RunConfig, tokenizer, p: AssignedPrompt, g: int, j: int, c: Completion) -> dict:
    """The rollout row of sample j of group g, scored by the task's verifier."""
    completion = decode_completion(tokenizer, c.tokens)
    task_reward = verify(p.task, completion, model_replies(tokenizer, c.tokens, c.mask))
    lr = cfg.length_reward
    penalty = length_penalty(lr.mode, len(c.tokens), p.target_length, lr.coef)
    return {
        "problem_id": p.task.problem_id,
        "group": g,
        "prompt_tokens": p.tokens,
        "completion_tokens": c.tokens,
        "completion_logprobs": c.logprobs,
        "completion_mask": c.mask if c.mask is not None else [1] * len(c.tokens),
        "reward": task_reward - penalty,
        "task_reward": task_reward,
        "length_penalty": penalty,
        "target_length": p.target_length,
        "seed": p.seeds[j],
        "temperature": cfg.sampling.temperature,
        "top_p": cfg.sampling.top_p,
        "proofs": c.proofs,
        "task_type": p.task.task_type,
        "prompt": p.text,
        "completion": completion,
    }


def score_rows(
    cfg: RunConfig,
    tokenizer,
    plan: list[AssignedPrompt],
    completions: list[Completion],
    a: Assignment,
    node: str,
) -> list[dict]:
    """The file's rows: every completion scored (`score_row`), labelled with the
    assignment's step and policy and the node."""
    done = iter(completions)
    rows = []
    for g, p in enumerate(plan):
        for j in range(len(p.seeds)):
            row = score_row(cfg, tokenizer, p, g, j, next(done))
            rows.append(row | {"step": a.step, "policy_step": a.policy_step, "node": node})
    return rows


def build_rows(
    cfg: RunConfig, tokenizer, source: TaskSource, backend, a: Assignment, node: str
) -> list[dict]:
    """The rows of the assignment's file, as an honest worker makes them."""
    cfg = with_budget(cfg, a)
    plan = plan_prompts(cfg, source, tokenizer, a)
    return score_rows(cfg, tokenizer, plan, complete(cfg, backend, plan, tokenizer), a, node)
