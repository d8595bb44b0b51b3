"""A step's loss: the chosen policy loss (trainer/losses/), optional entropy bonus and
KL penalty, divided by the loss's normaliser.

    loss = ( policy_sum − c_H · Σ_t H_t + c_KL · Σ_t k3_t ) / N

where policy_sum is what `trainer.loss` returns for the micro-batch (importance
weights already applied), H_t the entropy of the sampling distribution at token
t, k3_t = exp(ref − logp) − (ref − logp) − 1 ≥ 0 an estimate of KL(π_θ ‖ π_ref),
and N the mini-batch's normaliser (a constant budget, its tokens or its
samples: trainer/losses/__init__.py). Sums run over real tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarmrl.trainer import losses


@dataclass
class LossOut:
    loss: torch.Tensor
    clipped_tokens: float
    tokens: float
    entropy_sum: float
    kl_sum: float


def step_loss(
    logp: torch.Tensor,
    prox: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    weight: torch.Tensor,
    normaliser: float,
    cfg,
    entropy: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
) -> LossOut:
    """All tensors are [batch, tokens] (`adv` is [batch, 1]); `cfg` a TrainerConfig."""
    mask = mask.to(logp.dtype)
    total, no_grad = losses.get(cfg.loss).loss(logp, prox.detach(), adv, mask, weight, cfg)
    ent_sum = 0.0
    if entropy is not None:
        ent = (entropy * mask).sum()
        ent_sum = float(ent.detach())
        if cfg.entropy_coef > 0:
            total = total - cfg.entropy_coef * ent
    kl_sum = 0.0
    if ref_logp is not None:
        d = ref_logp - logp
        kl = ((torch.exp(d) - d - 1.0) * mask).sum()
        kl_sum = float(kl.detach())
        if cfg.kl_coef > 0:
            total = total + cfg.kl_coef * kl
    return LossOut(
        loss=total / normaliser,
        clipped_tokens=float((no_grad.to(mask.dtype) * mask).sum()),
        tokens=float(mask.sum()),
        entropy_sum=ent_sum,
        kl_sum=kl_sum,
    )
