"""What an assignment fixes, derived the same way by the worker and the validator.

From the assignment seed (itself derived from run seed, node key, step and
counter, protocol/assign.py) and the sampler state the trainer issued for the
step (tasks/curriculum.py: difficulty level, down-weighted problems): which
problems the file holds, the thinking budget of each (drawn from the
configured targets that fit the node's length budget, so slower hardware gets
shorter budgets), the exact prompt tokens,
and the sampling seed of every sample. A worker cannot choose any of these; a
validator recomputes them and compares.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from swarmrl.config import RunConfig
from swarmrl.models.prompting import encode_prompt, prompt_text
from swarmrl.protocol.sampler import SamplerState, draw_indices
from swarmrl.tasks.schema import Task
from swarmrl.tasks.sources.task_source import TaskSource
from swarmrl.toploc.sampling import sample_seed


@dataclass(frozen=True)
class AssignedPrompt:
    task: Task
    target_length: int
    text: str
    tokens: list[int]
    seeds: list[int]  # one per sample of the group


def budget_targets(targets: list[int], max_new_tokens: int) -> list[int]:
    """The thinking budgets a node may be given: the configured targets that fit its
    length budget (the assignment's, from its measured speed), else the smallest."""
    fitting = [t for t in targets if t <= max_new_tokens]
    return fitting or [min(targets)]


def assigned_prompts(
    cfg: RunConfig, source: TaskSource, tokenizer, assignment_seed: int, state: SamplerState
) -> list[AssignedPrompt]:
    """The prompt groups of one file, in file order."""
    lr = cfg.length_reward
    fitting = budget_targets(lr.targets, cfg.sampling.max_new_tokens)
    rng = random.Random(assignment_seed)
    out = []
    count = cfg.worker.groups_per_file
    for g, index in enumerate(draw_indices(assignment_seed, count, state, source.n_records)):
        task = source.get("train", index, state.level)
        target = rng.choice(fitting) if lr.mode != "none" else 0
        text = prompt_text(task.prompt, target)
        seeds = [sample_seed(assignment_seed, g, j) for j in range(cfg.worker.group_size)]
        out.append(AssignedPrompt(task, target, text, encode_prompt(tokenizer, text), seeds))
    return out
