"""The policy-gradient losses a run chooses by `trainer.loss`.

Every loss takes the same tensors, all [B, T] over completion tokens:
`logp` (log π_θ, with gradient), `prox` (log π_prox, the trainer's policy at
the start of the step, detached), `adv` ([B, 1], one advantage per sample),
`mask` (1.0 at real tokens, 0.0 at padding) and `weight` (the importance
weight π_prox/π_behav after `trainer.is_correction`, trainer/correction.py,
detached, 0.0 at padding). It returns the *sum* of its per-token (or
per-sequence) losses and a [B, T] mask of the tokens whose gradient its
clipping removed. The trainer divides the sum by the loss's `NORMALISER`:

    "budget"   a constant number of tokens (trainer.token_budget), whatever
               the batch holds: a token weighs the same in every step
    "tokens"   the real tokens of the mini-batch (a token-level mean)
    "samples"  the samples of the mini-batch (a sequence-level mean)

Each normaliser is known before the first micro-batch runs, so gradients
accumulated over micro-batches and summed over ranks equal the one-pass
gradient of the whole mini-batch.

`ADVANTAGE_SCALE` is each loss's own convention for `trainer.advantage_scale
= "auto"`: rewards minus the group mean, divided by the group's std
("group"), by the batch's std ("batch") or by nothing ("none").

What acts depends on `trainer.optimizer_steps`. At one optimizer step per
batch (the default) the only gradient pass runs at π_θ = π_prox: every ratio
is 1, no clip acts, and grpo, dapo and cispo are the same importance-weighted
policy gradient up to their normalisers (which AdamW and the gradient clip all
but remove); dr_grpo differs by its advantages (no std), gspo by its sequence
mean. From the second mini-batch of a step on (optimizer_steps > 1) π_θ has
moved and each loss's clip acts as its docstring says. docs/results.md has the
measured table.
"""

from __future__ import annotations

from types import ModuleType

from swarmrl.trainer.losses import cispo, dapo, dr_grpo, grpo, gspo

LOSSES: dict[str, ModuleType] = {
    "grpo": grpo,
    "dapo": dapo,
    "dr_grpo": dr_grpo,
    "gspo": gspo,
    "cispo": cispo,
}


def get(name: str) -> ModuleType:
    """The module of loss `name` (its `loss`, `NORMALISER` and `ADVANTAGE_SCALE`)."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}: one of {', '.join(LOSSES)}")
    return LOSSES[name]


def advantage_scale(cfg) -> str:
    """`trainer.advantage_scale`, with "auto" resolved to the loss's own convention."""
    if cfg.advantage_scale == "auto":
        return get(cfg.loss).ADVANTAGE_SCALE
    return cfg.advantage_scale
