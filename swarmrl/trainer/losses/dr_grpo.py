"""Dr. GRPO's loss: PPO's symmetric clip, advantages not divided by a std, and a
constant normaliser.

With r_t = exp(logp − prox) and A = r − mean(group rewards) (no std: the
"auto" advantage scale of this loss is "none"):

    loss_t = w_t · max(−r_t·A, −clip(r_t, 1−ε, 1+ε)·A)

summed over tokens and divided by a constant token budget, so neither the
length of a sample nor the spread of its group's rewards changes how much a
token weighs (both bias GRPO: toward long wrong answers and toward groups of
nearly equal rewards). The clip acts only with `trainer.optimizer_steps` > 1;
the unscaled advantages act at any setting.
"""

from __future__ import annotations

import torch

from swarmrl.trainer.losses.clip import ppo_clip

NORMALISER = "budget"
ADVANTAGE_SCALE = "none"


def loss(logp, prox, adv, mask, weight, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = torch.exp(logp - prox)
    token, clipped = ppo_clip(ratio, adv, 1.0 - cfg.epsilon, 1.0 + cfg.epsilon)
    return (token * weight * mask).sum(), clipped & (mask > 0)
