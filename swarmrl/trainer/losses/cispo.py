"""CISPO's loss: a REINFORCE term weighted by the clipped, detached ratio.

With r_t = exp(logp − prox):

    loss_t = −sg(min(r_t, r_max)) · w_t · A · logp_t

r_max = `trainer.cispo_max_ratio`; there is no lower bound (MiniMax-M1). Unlike
PPO's clip, which removes a token's gradient once its ratio leaves the range,
the clip here only bounds how much the token weighs: every token keeps a
gradient, the rare ones that PPO would drop included. The sum over tokens is
divided by the mini-batch's real tokens. The tokens counted as clipped are
those whose ratio was capped. At one optimizer step per batch r_t = 1, the cap
never binds, and the loss is the importance-weighted REINFORCE term.
"""

from __future__ import annotations

import torch

NORMALISER = "tokens"
ADVANTAGE_SCALE = "group"


def loss(logp, prox, adv, mask, weight, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = torch.exp(logp - prox).detach()
    coef = torch.clamp(ratio, max=cfg.cispo_max_ratio)
    token = -coef * weight * adv * logp
    return (token * mask).sum(), (ratio > cfg.cispo_max_ratio) & (mask > 0)
