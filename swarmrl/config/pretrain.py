"""The configuration of `swarmrl diloco`: the DiLoCo pre-training demo
(apps/pretrain/), its own file with its own keys, separate from a run's."""

from __future__ import annotations

from pydantic import Field

from swarmrl.config.base import Section
from swarmrl.config.diloco import DilocoConfig


class CorpusConfig(Section):
    lines: int = Field(
        20_000, ge=100, le=10_000_000, description="Generated corpus lines (all shards)."
    )
    seq_len: int = Field(64, ge=8, le=4096, description="Tokens per training sequence.")
    batch: int = Field(16, ge=1, le=4096, description="Sequences per inner step and site.")
    eval_lines: int = Field(
        256, ge=8, le=100_000, description="Held-out lines the global model is scored on."
    )


class DilocoModelConfig(Section):
    hidden: int = Field(64, ge=32, le=4096, description="Hidden size of the tiny Llama.")
    layers: int = Field(2, ge=1, le=64, description="Transformer layers.")


class InnerConfig(Section):
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


class PretrainConfig(Section):
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
