"""GSPO's loss: one ratio per sequence, the geometric mean of its token ratios.

With |y_i| the sample's real tokens:

    s_i    = exp( (1/|y_i|) Σ_t (logp_t − prox_t) )
    loss_i = w̄_i · max(−s_i·A_i, −clip(s_i, 1−ε_low, 1+ε_high)·A_i)

ε_low, ε_high = `trainer.gspo_epsilon_low`, `gspo_epsilon_high` (the paper's
3e-4 and 4e-4: a sequence ratio moves far less than a token's). w̄_i is the
mean importance weight over the sample's tokens (the sequence weight under the
seq_* corrections). The sum over sequences is divided by the mini-batch's
samples. A clipped sequence has no gradient on any of its tokens. At one
optimizer step per batch s_i = 1 and the clip does not act; the sequence mean
still weighs every sequence alike, whatever its length.
"""

from __future__ import annotations

import torch

from swarmrl.trainer.losses.clip import ppo_clip

NORMALISER = "samples"
ADVANTAGE_SCALE = "group"


def loss(logp, prox, adv, mask, weight, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    n = mask.sum(-1, keepdim=True).clamp(min=1.0)
    seq_ratio = torch.exp(((logp - prox) * mask).sum(-1, keepdim=True) / n)
    w = (weight * mask).sum(-1, keepdim=True) / n
    low, high = 1.0 - cfg.gspo_epsilon_low, 1.0 + cfg.gspo_epsilon_high
    seq, clipped = ppo_clip(seq_ratio, adv, low, high)
    seq = seq * w
    real = mask.sum(-1, keepdim=True) > 0
    no_grad = clipped & real
    return (seq * real).sum(), no_grad.expand_as(mask) & (mask > 0)
