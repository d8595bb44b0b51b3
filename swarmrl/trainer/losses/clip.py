"""PPO's clipped surrogate, shared by the losses that clip a ratio."""

from __future__ import annotations

import torch


def ppo_clip(ratio, adv, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """max(−r·A, −clip(r, low, high)·A) elementwise, and where the clipped side won
    (there the gradient is zero)."""
    unclipped = -ratio * adv
    clipped = -torch.clamp(ratio, low, high) * adv
    return torch.maximum(unclipped, clipped), clipped > unclipped
