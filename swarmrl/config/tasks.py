"""The task sections: which problems, how they are graded, the length reward and the curriculum."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from swarmrl.config.base import Section

REWARD_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")  # package.module:function


class TaskConfig(Section):
    """Which task the run trains on and how its problems are generated."""

    name: Literal["reverse_text", "addition", "multiplication", "reasoning_gym", "verifiers"] = (
        Field(
            "reverse_text",
            description="Built-in generator (reverse_text, addition, multiplication), "
            "reasoning-gym families "
            "(`gym`), or a verifiers taskset (`env`).",
        )
    )
    dataset: str | None = Field(
        None,
        description="Optional parquet or JSONL file of task records; when unset, "
        "problems are generated from the seed.",
    )
    min_len: int = Field(3, ge=1, le=64, description="reverse_text: shortest text.")
    max_len: int = Field(6, ge=1, le=64, description="reverse_text: longest text.")
    digits: int = Field(
        3,
        ge=1,
        le=12,
        description="addition: digits per operand; multiplication: digits of the smaller "
        "operand (the other has one more).",
    )
    instruction: str = Field(
        "",
        max_length=2000,
        description="Text added on a new line after every problem's prompt, e.g. "
        "'Answer with the number only.' (a format the model can follow).",
    )
    gym: list[str] = Field(
        default_factory=list,
        description="reasoning_gym: task families, e.g. ['basic_arithmetic', 'chain_sum'] "
        "(problem i comes from family i mod n).",
    )
    gym_options: dict[str, dict] = Field(
        default_factory=dict,
        description="reasoning_gym: per-family options for create_dataset, by family name.",
    )
    gym_size: int = Field(
        10_000, ge=1, le=10_000_000, description="reasoning_gym: problems per family and split."
    )
    env: str | None = Field(
        None, description="verifiers: the installed taskset's id (e.g. 'my-env' or 'owner/my-env')."
    )
    env_args: dict = Field(
        default_factory=dict, description="verifiers: fields of the taskset's config."
    )
    env_fingerprint: str = Field(
        "",
        max_length=200,
        description="verifiers: the taskset's code and the verifiers and pydantic versions "
        "every node must run (its prompts, tool answers and rewards come from them, and a "
        "validator would take a difference for a cheat); empty: the orchestrator's own, "
        "written into the run config it serves. A node with another refuses to start.",
    )
    reward: str = Field(
        "",
        max_length=200,
        description="Your own reward, 'package.module:function': function(prompt, completion, "
        "row) returns the task reward of every problem in place of the task's own verifier, "
        "run in a checker process on workers and validators alike and probed at start "
        "(tasks/graders/custom.py); the module must be importable there (installed, or on "
        "PYTHONPATH). Empty: the task's own verifier.",
    )
    reward_fingerprint: str = Field(
        "",
        max_length=300,
        description="task.reward: the function and a hash of its module's source that every "
        "node must run; empty: the orchestrator's own, written into the run config it serves "
        "(then the orchestrator must import it too). A node with another refuses to start.",
    )

    @field_validator("reward")
    @classmethod
    def _reward_spec(cls, v: str) -> str:
        if v and not REWARD_SPEC.fullmatch(v):
            raise ValueError(f"task.reward {v!r} must name a function as 'package.module:function'")
        return v

    @model_validator(mode="after")
    def _lengths(self) -> TaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"task.min_len ({self.min_len}) > task.max_len ({self.max_len})")
        if self.name == "reasoning_gym" and not self.gym:
            raise ValueError("task.name = 'reasoning_gym' needs task.gym (a list of families)")
        if self.name == "verifiers" and not self.env:
            raise ValueError("task.name = 'verifiers' needs task.env (the taskset id)")
        return self


class LengthRewardConfig(Section):
    """Thinking-budget rewards (off by default)."""

    mode: Literal["none", "exact", "max", "clip"] = Field(
        "none", description="How the completion length is rewarded against its target."
    )
    targets: list[Annotated[int, Field(ge=1, le=1 << 20)]] = Field(
        default_factory=lambda: [1000, 2000, 3000, 4000, 5000],
        min_length=1,
        description="Target lengths (tokens) drawn per prompt when mode is not 'none'; a "
        "node is given those within its length budget (else the smallest).",
    )
    coef: float = Field(
        0.0003, ge=0.0, le=1.0, description="Penalty per token of distance to the target."
    )


class CodeConfig(Section):
    """How `code` tasks run model-written programs (tasks/graders/sandbox.py)."""

    isolation: Literal["auto", "namespace", "process"] = Field(
        "auto",
        description="namespace: network, mount and PID namespaces (required); process: "
        "rlimits and a process group only; auto: namespace where unshare works.",
    )
    reward: Literal["fraction", "all"] = Field(
        "fraction", description="Reward: fraction of tests passed, or 1 only if all pass."
    )
    time_limit_s: float = Field(
        4.0, gt=0.0, le=60.0, description="CPU seconds per test (a task may ask for less)."
    )
    memory_mb: int = Field(512, ge=64, le=65536, description="Address space per test (MiB).")
    max_tests: int = Field(32, ge=1, le=1000, description="Tests run per completion, at most.")
    parallel: int = Field(
        2, ge=1, le=256, description="Sandboxed programs run at once by one grading process."
    )


class CurriculumConfig(Section):
    """[curriculum]: task difficulty that keeps up with the policy (tasks/curriculum.py)."""

    enabled: bool = Field(
        True,
        description="Adapt the task sampler to the policy: a difficulty level for generated "
        "tasks, per-problem weights for file datasets (false: level start_level throughout).",
    )
    start_level: int = Field(0, ge=0, le=1000, description="Difficulty level of step 1.")
    max_level: int = Field(
        -1,
        ge=-1,
        le=1000,
        description="Highest difficulty level; -1: the highest whose answers fit "
        "sampling.max_new_tokens for a character-level model.",
    )
    window_groups: int = Field(
        48,
        ge=1,
        le=100_000,
        description="Groups of the current level (read since its last change) that a "
        "level decision looks at.",
    )
    up_reward: float = Field(
        0.7, ge=0.0, le=1.0, description="Level up when the window's mean reward reaches this."
    )
    down_reward: float = Field(
        0.1, ge=0.0, le=1.0, description="Level down when the window's mean reward falls to this."
    )
    min_signal: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="Floor on the fraction of groups with signal (not all rewards equal): "
        "below it the trainer warns and the level moves toward where signal is "
        "(up if most groups were solved by every sample, down if most failed).",
    )
    history_groups: int = Field(
        2,
        ge=1,
        le=1000,
        description="File datasets: a problem whose last this many groups were all solved "
        "(or all failed) by every sample is down-weighted.",
    )
    mastered_weight: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="File datasets: draw weight of a down-weighted problem (others: 1); "
        "the floor that keeps every problem in reach.",
    )

    @model_validator(mode="after")
    def _rewards(self) -> CurriculumConfig:
        if self.down_reward >= self.up_reward:
            raise ValueError(
                f"curriculum.down_reward ({self.down_reward}) must be below "
                f"curriculum.up_reward ({self.up_reward})"
            )
        if self.max_level != -1 and self.start_level > self.max_level:
            raise ValueError(
                f"curriculum.start_level ({self.start_level}) > curriculum.max_level "
                f"({self.max_level})"
            )
        return self
