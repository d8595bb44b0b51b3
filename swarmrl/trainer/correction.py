"""Importance weights between the trainer's policy and the one that sampled, and
the mismatch between them.

Three policies meet in an asynchronous step (decoupled PPO):

- π_behav, the policy that sampled: the log-probs the worker recorded beside
  each token (`completion_logprobs`), under the distribution it actually drew
  from (temperature and nucleus included). Its weights may be up to
  `async_level` versions old, and its numerics are the worker's.
- π_prox, the trainer's policy at the start of the step, recomputed by the
  trainer at the same temperature and nucleus. The loss's clip acts against it.
- π_θ, the policy being optimised.

A token's importance weight w = π_prox/π_behav = exp(log π_prox − log π_behav)
corrects for staleness and for trainer/inference mismatch at once. The
weight multiplies each token's loss and is never differentiated.
`trainer.is_correction` chooses how it is used:

    none       w = 1 (the recorded log-probs feed only the metrics)
    token_tis  w_t = min(w_t, C)                       truncated per token
    token_mis  w_t = w_t if lo ≤ w_t ≤ hi, else 0      masked per token
    seq_tis    w_i = min(Π_t w_t, C) for every token   truncated per sequence
    seq_mis    w_i = Π_t w_t if lo ≤ Π_t w_t ≤ hi, else 0
    geo_mask   1 if glo ≤ (Π_t w_t)^(1/|y|) ≤ ghi, else 0  (geometric mean; mask only)

The geometric mean of a sequence's weights averages its per-token log-ratios, so
it strays from 1 less than one token's weight does: geo_mask has bounds of its
own (`geo_low`, `geo_high`: 0.8 and 1.25), set from the default run, where the
5th and 95th percentiles of the honest sequences' means were 0.85-0.98 and
1.006-1.12 over its steps (staleness 2; `geo_weight_p05`, `geo_weight_p95`).
At the token bounds (0.5, 2), which it used to share, it masked nothing in
the losses x corrections table of docs/results.md.

What a forged log-prob can do. Log-probs are checked by a validator only on
the files it draws; on the others a worker may write anything. Writing them
higher than the truth makes w smaller: the worker's own tokens weigh less.
Writing them lower makes w larger: under `none` nothing uses them; under the
TIS modes a token (or sequence) weighs at most C, as much as an honest one
the trainer deems C times likelier than the worker did; under the MIS modes
and `geo_mask` a weight outside [lo, hi] zeroes the token or sequence. No mode
lets a forged log-prob flip the sign of an advantage or exceed C. The mismatch
below exposes the forgery: the trainer reports it per node
(`POST /v1/trainer/mismatch`), and a node far outside the swarm is validated.

Mismatch, per token, is the k3 estimate of KL(π_behav ‖ π_prox) from tokens
drawn from π_behav: with x = log π_prox − log π_behav, k3 = eˣ − 1 − x ≥ 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MODES = ("none", "token_tis", "token_mis", "seq_tis", "seq_mis", "geo_mask")
X_MAX = 50.0  # |log π_prox − log π_behav| counted in the mismatch figures
KL_MAX = 1e6  # the largest per-node figure the orchestrator takes


@dataclass(frozen=True)
class Correction:
    mode: str = "none"
    cap: float = 2.0  # C, for the TIS modes
    low: float = 0.5  # lo, for the masking modes
    high: float = 2.0  # hi

    @classmethod
    def of(cls, cfg) -> Correction:
        """From a TrainerConfig: geo_mask takes its own bounds."""
        if cfg.is_correction == "geo_mask":
            return cls(cfg.is_correction, cfg.is_cap, cfg.geo_low, cfg.geo_high)
        return cls(cfg.is_correction, cfg.is_cap, cfg.is_low, cfg.is_high)


def importance_weights(
    prox: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor, c: Correction
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights [B, T] (zero at padding) and which real tokens were truncated or masked.

    `prox`, `behav`: log-probs [B, T]; `mask`: True at real tokens."""
    real = mask.to(prox.dtype)
    x = (prox.detach() - behav) * real
    ones = torch.ones_like(x)
    if c.mode == "none":
        return ones * real, torch.zeros_like(mask)
    if c.mode in ("token_tis", "token_mis"):
        w = torch.exp(x)
    else:
        seq = x.sum(-1, keepdim=True)
        if c.mode == "geo_mask":
            seq = seq / real.sum(-1, keepdim=True).clamp(min=1.0)
        w = torch.exp(seq).expand_as(x)
    if c.mode.endswith("tis"):
        cut = w > c.cap
        return w.clamp(max=c.cap) * real, cut & mask
    keep = (w >= c.low) & (w <= c.high)
    kept = ones if c.mode == "geo_mask" else w
    return torch.where(keep, kept, 0.0) * real, ~keep & mask


@dataclass
class Mismatch:
    """Per-sample sums over its real tokens, so that ranks can add them up."""

    kl: list[float]  # Σ k3
    tokens: list[float]
    excluded: list[float]  # tokens truncated or masked
    log_ratio: list[float]  # Σ x
    log_ratio_sq: list[float]  # Σ x²

    @classmethod
    def zeros(cls, n: int) -> Mismatch:
        return cls(*([0.0] * n for _ in range(5)))

    def add(self, rows: list[int], prox, behav, mask, excluded) -> None:
        real = mask.to(torch.float64)
        # a forged log-prob may be anything finite: x is clamped to ±X_MAX in the
        # figures (k3 ≤ e^50), so they stay finite; such a node is flagged anyway
        x = ((prox.detach() - behav).to(torch.float64) * real).clamp(-X_MAX, X_MAX)
        k3 = (torch.exp(x) - 1.0 - x) * real
        sums = [k3, real, excluded.to(real.dtype), x, x * x]
        for field, per_row in zip(
            (self.kl, self.tokens, self.excluded, self.log_ratio, self.log_ratio_sq),
            (s.sum(-1).tolist() for s in sums),
            strict=True,
        ):
            for i, v in zip(rows, per_row, strict=False):
                field[i] += v

    def flat(self) -> list[float]:
        return [*self.kl, *self.tokens, *self.excluded, *self.log_ratio, *self.log_ratio_sq]

    @classmethod
    def unflat(cls, values: list[float]) -> Mismatch:
        n = len(values) // 5
        return cls(*(list(values[k * n : (k + 1) * n]) for k in range(5)))


def mismatch_metrics(samples, m: Mismatch, step: int) -> dict:
    """The step's figures: mismatch KL per token, the fraction of tokens truncated or
    masked, the spread (std) of the log-ratio, the 5th and 95th percentiles of the
    samples' geometric mean weights, and the mismatch KL by staleness."""
    tokens = sum(m.tokens)
    if not tokens:
        return {}
    mean = sum(m.log_ratio) / tokens
    var = max(sum(m.log_ratio_sq) / tokens - mean * mean, 0.0)
    by_staleness: dict[int, list[float]] = {}
    for s, kl, n in zip(samples, m.kl, m.tokens, strict=True):
        acc = by_staleness.setdefault(step - s.policy_step, [0.0, 0.0])
        acc[0] += kl
        acc[1] += n
    # each sample's geometric mean weight, as geo_mask sees it: its spread over the
    # samples is what geo_low and geo_high must leave room for
    geo = sorted(math.exp(x / n) for x, n in zip(m.log_ratio, m.tokens, strict=True) if n)
    return {
        "mismatch_kl": sum(m.kl) / tokens,
        "is_excluded_fraction": sum(m.excluded) / tokens,
        "log_ratio_mean": mean,
        "log_ratio_std": var**0.5,
        "geo_weight_p05": geo[max(math.ceil(0.05 * len(geo)) - 1, 0)],  # nearest rank
        "geo_weight_p95": geo[max(math.ceil(0.95 * len(geo)) - 1, 0)],
        **{
            f"mismatch_kl_staleness_{k}": v[0] / v[1]
            for k, v in sorted(by_staleness.items())
            if v[1]
        },  # fmt: skip
    }


def mismatch_by_node(samples, m: Mismatch, step: int) -> list[dict]:
    """The body of `POST /v1/trainer/mismatch`: per (node, checked, staleness) cell, the
    tokens, their mean mismatch KL, the fraction truncated or masked, and the files."""
    acc: dict[tuple[str, bool, int], list] = {}
    for s, kl, n, ex in zip(samples, m.kl, m.tokens, m.excluded, strict=True):
        a = acc.setdefault(
            (s.node, s.checked, max(step - s.policy_step, 0)), [0.0, 0.0, 0.0, set()]
        )
        a[0] += kl
        a[1] += n
        a[2] += ex
        a[3].add(s.file)
    return [
        {
            "node": node,
            "checked": checked,
            "staleness": staleness,
            "tokens": int(n),
            "kl": min(max(kl / n, 0.0), KL_MAX),  # k3 ≥ 0; rounding may dip below
            "truncated": ex / n,
            "files": len(files),
        }
        for (node, checked, staleness), (kl, n, ex, files) in sorted(acc.items())
        if node and n
    ]
