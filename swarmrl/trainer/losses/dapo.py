"""DAPO's loss: PPO's clip with a higher upper bound (clip-higher), token-level mean.

With r_t = exp(logp − prox):

    loss_t = w_t · max(−r_t·A, −clip(r_t, 1−ε_low, 1+ε_high)·A)

ε_low = `trainer.epsilon`, ε_high = `trainer.epsilon_high` (DAPO: 0.2 and
0.28): a token the policy thinks unlikely may grow further before its gradient
stops, which keeps entropy from collapsing. The sum over tokens is divided by
the mini-batch's real tokens, so every token of the batch weighs the same
(long samples are not diluted per sample). Clip-higher acts only with
`trainer.optimizer_steps` > 1: at one step per batch r_t = 1 in the gradient
pass.
"""

from __future__ import annotations

import torch

from swarmrl.trainer.losses.clip import ppo_clip

NORMALISER = "tokens"
ADVANTAGE_SCALE = "group"


def loss(logp, prox, adv, mask, weight, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = torch.exp(logp - prox)
    token, clipped = ppo_clip(ratio, adv, 1.0 - cfg.epsilon, 1.0 + cfg.epsilon_high)
    return (token * weight * mask).sum(), clipped & (mask > 0)
