"""The DiLoCo outer loop's settings (diloco/), shared by the RL trainer's
`[trainer.diloco]` (config/trainer.py) and the pre-training demo's `[diloco]`
(config/pretrain.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmrl.config.base import Section


class DilocoConfig(Section):
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
