"""Configuration of the GRPO trainer (`[trainer]`, with `[trainer.diloco]`)."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config.base import Section
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


class TrainerConfig(Section):
    """The GRPO trainer."""

    steps: int = Field(40, ge=1, le=10_000_000, description="Training steps in the run.")
    max_minutes: float = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description="End the run after the step that reaches this many minutes since the "
        "trainer started (0: no limit; `steps` still caps it).",
    )
    batch_groups: int = Field(
        16, ge=1, le=100_000, description="Prompt groups with nonzero advantage per step."
    )
    micro_batch: int = Field(64, ge=1, le=100_000, description="Samples per forward pass.")
    share_prompts: bool = Field(
        True,
        description="Run each distinct prompt of a micro-batch once, its samples' completions "
        "on its cached keys and values (same log-probs and gradients, fewer tokens).",
    )
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    optimizer_steps: int = Field(
        1, ge=1, le=64, description="Optimizer steps per rollout batch (mini-batches)."
    )
    epsilon: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip range ε.")
    delta: float = Field(4.0, gt=1.0, le=1000.0, description="Two-sided clip bound δ on r.")
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
