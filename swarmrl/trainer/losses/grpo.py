"""INTELLECT-2's GRPO loss: PPO's clip with a two-sided bound δ on the ratio.

With r_t = π_θ/π_prox = exp(logp − prox) and the sample's advantage A:

    ρ_t    = min(r_t, δ)
    loss_t = w_t · max(−ρ_t·A, −clip(ρ_t, 1−ε, 1+ε)·A)

Plain PPO is unbounded for A < 0 as r grows; capping r at δ bounds a token's
loss by δ·|A| and, min(r, δ) being constant above δ, gives no gradient there.
The sum over tokens is divided by a constant token budget. With w = 1 this is
the loss swarmrl had before the correction existed. At one optimizer step per
batch (the default) r_t = 1 throughout and neither the clip nor δ acts: the
loss is the importance-weighted policy gradient (see the package's docstring).
"""

from __future__ import annotations

import torch

from swarmrl.trainer.losses.clip import ppo_clip

NORMALISER = "budget"
ADVANTAGE_SCALE = "group"


def loss(logp, prox, adv, mask, weight, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = torch.exp(logp - prox)
    rho = torch.clamp(ratio, max=cfg.delta)
    token, clipped = ppo_clip(rho, adv, 1.0 - cfg.epsilon, 1.0 + cfg.epsilon)
    no_grad = clipped | (ratio > cfg.delta)
    return (token * weight * mask).sum(), no_grad & (mask > 0)
