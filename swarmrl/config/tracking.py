"""[tracking]: where a run's figures go besides metrics.jsonl (TensorBoard, Weights & Biases).

Imports nothing heavy, as swarmrl/config/run.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmrl.config.base import Section


class TrackingConfig(Section):
    """[tracking]: experiment trackers fed from what the run records (swarmrl/tracking.py)."""

    tensorboard: bool = Field(
        True, description="Write TensorBoard event files to runs/<name>/tensorboard."
    )
    wandb: Literal["off", "offline", "online"] = Field(
        "off",
        description="Weights & Biases: 'offline' writes a run directory under "
        "runs/<name>/wandb with no network or account (`wandb sync` uploads it later); "
        "'online' logs live and needs `wandb login` (or WANDB_API_KEY).",
    )
    wandb_project: str = Field("swarmrl", max_length=128, description="W&B project.")
    wandb_entity: str = Field("", max_length=128, description="W&B entity ('': your default).")
    nodes: bool = Field(
        True,
        description="Also track per-node figures each step (files accepted and rejected, "
        "stake, log-prob mismatch), read from the orchestrator's ledger.",
    )
