"""GRPO loss with two-sided clipping (INTELLECT-2).

Per completion token, with r = exp(logp − old_logp) against log-probs the
trainer recomputed at the start of the step, and advantage A:

    ρ = min(r, δ)
    loss_t = max(−ρ·A, −clip(ρ, 1−ε, 1+ε)·A)

The plain PPO objective is unbounded for A < 0 as r grows; capping r at δ
bounds it by δ·|A| and, because min(r, δ) is constant above δ, gives no
gradient there. Token losses are summed and divided by a constant token
budget (not by the batch's token count), so long and short completions weigh
per token, not per sample. An entropy bonus and a k3 KL estimate to a
reference policy are optional.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossOut:
    loss: torch.Tensor
    clipped_tokens: float
    tokens: float
    entropy_sum: float
    kl_sum: float


def grpo_token_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    delta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss and a mask of tokens where clipping removed the gradient."""
    ratio = torch.exp(logp - old_logp)
    rho = torch.clamp(ratio, max=delta)
    unclipped = -rho * advantages
    clipped = -torch.clamp(rho, 1.0 - epsilon, 1.0 + epsilon) * advantages
    loss = torch.maximum(unclipped, clipped)
    no_grad = (clipped > unclipped) | (ratio > delta)
    return loss, no_grad


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    token_budget: float,
    epsilon: float = 0.2,
    delta: float = 4.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> LossOut:
    """All tensors are [batch, tokens]; `advantages` is broadcast per sample as [batch, 1]."""
    mask = mask.to(logp.dtype)
    token_loss, no_grad = grpo_token_loss(logp, old_logp, advantages, epsilon, delta)
    total = (token_loss * mask).sum()
    ent_sum = 0.0
    if entropy is not None:
        ent = (entropy * mask).sum()
        ent_sum = float(ent.detach())
        if entropy_coef > 0:
            total = total - entropy_coef * ent
    kl_sum = 0.0
    if ref_logp is not None:
        # k3 estimator of KL(π || π_ref): exp(ref − logp) − (ref − logp) − 1 ≥ 0
        d = ref_logp - logp
        kl = ((torch.exp(d) - d - 1.0) * mask).sum()
        kl_sum = float(kl.detach())
        if kl_coef > 0:
            total = total + kl_coef * kl
    return LossOut(
        loss=total / token_budget,
        clipped_tokens=float((no_grad.to(mask.dtype) * mask).sum()),
        tokens=float(mask.sum()),
        entropy_sum=ent_sum,
        kl_sum=kl_sum,
    )
