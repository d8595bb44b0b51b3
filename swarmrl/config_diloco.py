"""Configuration of DiLoCo: the outer loop (`[diloco]`) and the `swarmrl diloco`
pre-training run that uses it (swarmrl/diloco/)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmrl.config_base import _Section


class DilocoConfig(_Section):
    inner_steps: int = Field(
        50, ge=1, le=100_000, description="H: inner optimizer steps between synchronisations."
    )
    outer_lr: float = Field(0.7, gt=0, le=10, description="Outer SGD learning rate.")
    outer_momentum: float = Field(
        0.9, ge=0, lt=1, description="Outer SGD Nesterov momentum (0 turns momentum off)."
    )
    bits: Literal[8, 32] = Field(
        8, description="Pseudo-gradient payload: 8 (uint8 codes, per-block scales) or 32 (fp32)."
    )
    block: int = Field(
        256, ge=16, le=65536, description="Values per quantization block (one fp32 scale each)."
    )
    lighthouse: str = Field(
        "",
        description="host:port of the torchft lighthouse that forms quorums; empty: "
        "`swarmrl diloco` starts one on loopback.",
    )
    host: str = Field(
        "127.0.0.1",
        description="Address other sites reach this site at: its torchft manager and the "
        "server a joiner recovers the global state from.",
    )
    join_timeout_s: float = Field(
        120.0,
        gt=0,
        le=86400,
        description="How long a quorum waits for a site that is still heartbeating (a site "
        "that stopped heartbeating is left out after heartbeat_timeout_s); longer than "
        "one round of inner steps, so a joiner waits for the others' next sync.",
    )
    heartbeat_timeout_s: float = Field(
        5.0, gt=0, le=3600, description="A site silent this long is out of the next quorum."
    )
    timeout_s: float = Field(
        60.0, gt=0, le=86400, description="Bound on one collective or one live recovery."
    )
    quorum_timeout_s: float = Field(
        900.0, gt=0, le=86400, description="How long a site waits for a quorum to form."
    )
    max_retries: int = Field(
        3,
        ge=0,
        le=100,
        description="Failed syncs of one pseudo-gradient (a site died mid-sync) retried "
        "without it before the round's inner steps are dropped.",
    )
    min_sites: int = Field(
        1, ge=1, le=1024, description="Fewest sites with which an outer step is committed."
    )


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


class CorpusConfig(_Section):
    lines: int = Field(
        20_000, ge=100, le=10_000_000, description="Generated corpus lines (all shards)."
    )
    seq_len: int = Field(64, ge=8, le=4096, description="Tokens per training sequence.")
    batch: int = Field(16, ge=1, le=4096, description="Sequences per inner step and site.")
    eval_lines: int = Field(
        256, ge=8, le=100_000, description="Held-out lines the global model is scored on."
    )


class DilocoModelConfig(_Section):
    hidden: int = Field(64, ge=32, le=4096, description="Hidden size of the tiny Llama.")
    layers: int = Field(2, ge=1, le=64, description="Transformer layers.")


class InnerConfig(_Section):
    lr: float = Field(2e-3, gt=0, le=1, description="Inner AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=1, description="Inner AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="Gradient norm clip per step.")
    warmup_steps: int = Field(
        20, ge=0, le=1_000_000, description="Inner steps of linear learning-rate warm-up."
    )
    min_lr_ratio: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Cosine decay of the inner learning rate over the run's inner steps "
        "(outer_steps · inner_steps) down to this fraction of lr; 1 keeps it constant.",
    )


class PretrainConfig(_Section):
    name: str = Field("diloco", description="Run name: runs/<name>/.")
    runs_dir: str = Field("runs", description="Directory holding runs/<name>/.")
    seed: int = Field(0, ge=0, le=2**62, description="Root seed: model init and data order.")
    sites: int = Field(3, ge=1, le=64, description="Sites started by `swarmrl diloco`.")
    outer_steps: int = Field(20, ge=1, le=1_000_000, description="Outer steps to train.")
    threads: int = Field(1, ge=1, le=256, description="torch threads per site.")
    restart: bool = Field(
        True,
        description="Restart a site that dies; it rejoins by live recovery from a peer.",
    )
    checkpoint_every: int = Field(
        10,
        ge=0,
        le=1_000_000,
        description="Outer steps between asynchronous checkpoints of each site (and one at "
        "the end); 0: none.",
    )
    keep_checkpoints: int = Field(2, ge=1, le=1000, description="Checkpoints kept per site.")
    model: DilocoModelConfig = Field(default_factory=DilocoModelConfig, description="Model.")
    corpus: CorpusConfig = Field(default_factory=CorpusConfig, description="Data.")
    inner: InnerConfig = Field(default_factory=InnerConfig, description="Inner optimizer.")
    diloco: DilocoConfig = Field(default_factory=DilocoConfig, description="Outer loop.")
