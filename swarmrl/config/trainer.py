"""Configuration of the GRPO trainer (`[trainer]`, with `[trainer.diloco]`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from swarmrl.config.base import DEVICE_SETTING, Section
from swarmrl.config.diloco import DilocoConfig


class TrainerDilocoConfig(DilocoConfig):
    """[trainer.diloco]: GRPO trainer sites that synchronise their policies (DiLoCo for RL)."""

    sites: int = Field(
        0,
        ge=0,
        le=64,
        description="0: off. N: `swarmrl rl` starts a lighthouse and N sites, each a swarm "
        "of its own (orchestrator, trainer, relays, validators, workers) in "
        "runs/<name>/site-K/, whose trainers average their policies every inner_steps steps.",
    )
    site: int = Field(0, ge=0, le=1023, description="This trainer's site (set by `swarmrl rl`).")
    inner_steps: int = Field(
        10, ge=1, le=100_000, description="H: GRPO steps of a site between synchronisations."
    )


class TrainerLoraConfig(Section):
    """[trainer.lora]: train low-rank adapters instead of every weight (trainer/lora.py)."""

    rank: int = Field(
        0,
        ge=0,
        le=4096,
        description="r: the adapters' rank (0: off, every weight trained). Above 0, versions "
        "after 0 are the adapter alone (a few MB); nodes run it merged into version 0. One "
        "trainer rank, no DiLoCo, no KL penalty.",
    )
    alpha: float = Field(
        32.0, gt=0.0, le=1e6, description="α: an adapter adds (α/r)·B·A to its layer's weight."
    )
    target_modules: list[str] = Field(
        ["all-linear"],
        min_length=1,
        description="The layers adapted: module names (q_proj, ...) or all-linear (every "
        "linear layer but the output head).",
    )


class TrainerConfig(Section):
    """The GRPO trainer."""

    steps: int = Field(40, ge=1, le=10_000_000, description="Training steps in the run.")
    max_minutes: float = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description="End the run after the step that reaches this many minutes since the "
        "trainer started (0: no limit; `steps` still caps it). What such a run learns "
        "depends on the machine's speed; a budget of `steps` does not.",
    )
    batch_groups: int = Field(
        16, ge=1, le=100_000, description="Prompt groups with nonzero advantage per step."
    )
    first_batch_groups: int = Field(
        0, ge=0, le=100_000,
        description="Groups with nonzero advantage the first step trains on (0: batch_groups). "
        "A run whose task the model rarely solves at first waits for its first batch longest; "
        "a smaller one starts it sooner, the rest carried to the next step.",
    )  # fmt: skip
    micro_batch: int = Field(64, ge=1, le=100_000, description="Samples per forward pass.")

    def batch_for(self, step: int) -> int:
        """Groups with signal step `step` trains on (first_batch_groups for the first)."""
        return (
            self.first_batch_groups if step == 1 and self.first_batch_groups else self.batch_groups
        )

    share_prompts: bool = Field(
        True,
        description="Run each distinct prompt of a micro-batch once, its samples' completions "
        "on its cached keys and values (same log-probs and gradients, fewer tokens).",
    )
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="AdamW learning rate.")
    warmup_steps: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="The learning rate rises linearly over this many steps to `lr` "
        "(step k of them trains at lr·k/warmup_steps); 0: `lr` from the first step.",
    )
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    optimizer_steps: int = Field(
        1, ge=1, le=64, description="Optimizer steps per rollout batch (mini-batches)."
    )
    loss: Literal["grpo", "dapo", "dr_grpo", "gspo", "cispo"] = Field(
        "grpo",
        description="Policy loss (trainer/losses/): grpo (INTELLECT-2's two-sided clip, "
        "constant normaliser), dapo (clip-higher, token mean), dr_grpo (no std scaling, "
        "constant normaliser), gspo (sequence-level ratio), cispo (clipped detached ratio "
        "weighting a REINFORCE term).",
    )
    advantage_scale: Literal["auto", "group", "batch", "none"] = Field(
        "auto",
        description="Advantages are rewards minus the group's mean, divided by the group's "
        "std (group), the batch's std (batch) or nothing (none); auto: the loss's own "
        "convention (none for dr_grpo, group for the others).",
    )
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip range ε (ε_low of dapo).")
    epsilon_high: float = Field(
        0.28, gt=0.0, le=10.0, description="dapo: upper clip range ε_high (clip-higher)."
    )
    delta: float = Field(
        4.0,
        gt=1.0,
        le=1000.0,
        description="grpo: two-sided clip bound δ on r; at least 1 + epsilon (a bound inside "
        "the clip range would cut what the clip already keeps).",
    )
    gspo_epsilon_low: float = Field(
        3e-4, gt=0.0, lt=1.0, description="gspo: lower clip range of the sequence ratio."
    )
    gspo_epsilon_high: float = Field(
        4e-4, gt=0.0, le=10.0, description="gspo: upper clip range of the sequence ratio."
    )
    cispo_max_ratio: float = Field(
        5.0, gt=1.0, le=1000.0, description="cispo: cap of the detached ratio π_θ/π_prox."
    )
    is_correction: Literal["none", "token_tis", "token_mis", "seq_tis", "seq_mis", "geo_mask"] = (
        Field(
            "token_tis",
            description="Importance weight π_prox/π_behav against the sampling policy's "
            "recorded log-probs (trainer/correction.py): none, truncated at is_cap per token "
            "or sequence (token_tis, seq_tis), masked outside [is_low, is_high] per token or "
            "sequence (token_mis, seq_mis), or sequences masked by the geometric mean of "
            "their token weights outside [geo_low, geo_high] (geo_mask).",
        )
    )
    is_cap: float = Field(
        2.0, ge=1.0, le=1e6, description="C: the largest importance weight (token_tis, seq_tis)."
    )
    is_low: float = Field(
        0.5, ge=0.0, le=1.0, description="lo: smaller weights are masked (token_mis, seq_mis)."
    )
    is_high: float = Field(
        2.0, ge=1.0, le=1e6, description="hi: larger weights are masked (token_mis, seq_mis)."
    )
    geo_low: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="geo_mask: a sequence whose per-token geometric mean weight is smaller is "
        "masked. A mean over tokens strays from 1 less than one token's weight: in the "
        "default run 90% of sequences lay within 0.85-1.12 (metrics geo_weight_p05/p95).",
    )
    geo_high: float = Field(
        1.25,
        ge=1.0,
        le=1e6,
        description="geo_mask: a sequence whose per-token geometric mean weight is larger "
        "is masked.",
    )
    entropy_coef: float = Field(0.0, ge=0.0, le=1.0, description="Entropy bonus weight.")
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description="KL-to-reference weight (k3).")
    grad_clip: float = Field(1.0, gt=0.0, le=1e6, description="Gradient-norm clip.")
    token_budget: int = Field(
        0,
        ge=0,
        le=10**9,
        description="Constant divisor of the token-summed loss; 0 means "
        "batch_groups · group_size · max_new_tokens.",
    )
    threads: int = Field(1, ge=1, le=256, description="torch threads of each trainer rank.")
    device: str = Field(
        "auto",
        pattern=DEVICE_SETTING,
        description="Where each trainer rank computes: auto (its CUDA device if torch sees "
        "one, else the CPU), cpu, cuda (an error without one) or cuda:N.",
    )
    ranks: int = Field(
        1,
        ge=1,
        le=1024,
        description="Trainer processes on this machine: above 1, `swarmrl rl` starts the "
        "trainer under torchrun and shards the policy with FSDP2 (gloo on CPU, NCCL on GPU); "
        "rank 0 talks to the orchestrator and publishes. A resume may change it.",
    )
    poll_s: float = Field(0.1, gt=0.0, le=60.0, description="Wait between store polls.")
    diloco: TrainerDilocoConfig = Field(
        default_factory=TrainerDilocoConfig, description="DiLoCo across trainer sites."
    )
    lora: TrainerLoraConfig = Field(
        default_factory=TrainerLoraConfig, description="LoRA adapters (trainer/lora.py)."
    )

    @model_validator(mode="after")
    def _delta_outside_the_clip(self) -> TrainerConfig:
        if self.delta < 1.0 + self.epsilon:
            raise ValueError(
                f"trainer.delta ({self.delta:g}) must be at least 1 + trainer.epsilon "
                f"({1.0 + self.epsilon:g}): the two-sided bound sits outside the clip range"
            )
        return self
