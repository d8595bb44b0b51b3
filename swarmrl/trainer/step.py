"""One policy-gradient update on a collected batch.

1. π_prox, the log-probs of the policy at the start of the step, are recomputed
   in micro-batches without gradient. With one optimizer step per batch they
   equal the detached log-probs of the gradient pass, so that extra forward pass
   is skipped.
2. Every token gets an importance weight π_prox/π_behav against the log-probs
   the worker recorded (trainer/correction.py), and the step measures the
   mismatch between the two.
3. The batch is split into `optimizer_steps` mini-batches; each is one optimizer
   step, accumulated over micro-batches, with the loss of `trainer.loss`
   (trainer/losses/) divided by the loss's normaliser for the mini-batch.
4. Gradients are clipped by global norm.

Log-probs are those of the distribution the worker sampled from: softmax of
logits / T at the sample's temperature, renormalised over the nucleus when
`sampling.top_p` < 1 (toploc/sampling.py computes the same function), and so
is the entropy metric. Sequences are right-padded; the logits at positions
len(prompt)−1 … len(prompt)+len(completion)−2 score the completion tokens. With
`trainer.share_prompts` (the default), the samples of a micro-batch that share
a prompt (a GRPO group) run it once and their completions on its cached keys
and values (`_shared_prompt_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarmrl.config import TrainerConfig
from swarmrl.device import model_device
from swarmrl.inference.generation import with_cache
from swarmrl.toploc.sampling import nucleus_mask
from swarmrl.trainer import losses
from swarmrl.trainer.batch import Sample
from swarmrl.trainer.correction import Correction, Mismatch, importance_weights
from swarmrl.trainer.loss import step_loss


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    clip_fraction: float
    entropy: float
    kl: float
    tokens: int
    mismatch: Mismatch | None = None  # per sample of the batch, summed over its tokens


def _pack(samples: list[Sample], pad_id: int, device):
    """Right-padded ids and attention, the index of the logit that predicts each
    completion token, the completion tokens and the mask of those the loss sees (the
    model's own: not padding, not an environment's); built on the CPU in one piece
    and moved to `device` in one copy each."""
    seqs = [s.prompt_tokens + s.completion_tokens for s in samples]
    width = max(len(x) for x in seqs)
    comp_width = max(len(s.completion_tokens) for s in samples)
    cpu = torch.device("cpu")
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long, device=cpu)
    attn = torch.zeros((len(samples), width), dtype=torch.long, device=cpu)
    gather = torch.zeros((len(samples), comp_width), dtype=torch.long, device=cpu)
    mask = torch.zeros((len(samples), comp_width), dtype=torch.bool, device=cpu)
    targets = torch.zeros((len(samples), comp_width), dtype=torch.long, device=cpu)
    for i, (s, x) in enumerate(zip(samples, seqs, strict=True)):
        ids[i, : len(x)] = torch.tensor(x, device=cpu)
        attn[i, : len(x)] = 1
        n, p = len(s.completion_tokens), len(s.prompt_tokens)
        gather[i, :n] = torch.arange(p - 1, p - 1 + n, device=cpu)
        if s.completion_mask is None:
            mask[i, :n] = True
        else:
            mask[i, :n] = torch.tensor(s.completion_mask, dtype=torch.bool, device=cpu)
        targets[i, :n] = torch.tensor(s.completion_tokens, device=cpu)
    return tuple(t.to(device, non_blocking=True) for t in (ids, attn, gather, targets, mask))


def token_logprobs(
    model,
    samples: list[Sample],
    pad_id: int,
    with_entropy: bool = False,
    share: bool = True,
    steady: bool = False,
    top_p: float = 1.0,
    entropy_grad: bool = False,
):
    """Log-probs [B, T] of each sample's completion tokens (and their entropies, with a
    gradient if `entropy_grad`), with the mask of real tokens, under the distribution
    it was sampled from: logits divided by the sample's temperature, renormalised
    over the nucleus of `top_p`.
    With `share`, each distinct prompt runs once (below). `steady`: take the same
    path whatever the batch holds (a sharded model's forward passes are collectives,
    so every rank must make as many)."""
    device = model_device(model)
    ids, attn, gather, targets, mask = _pack(samples, pad_id, device)
    shared = steady or len({tuple(s.prompt_tokens) for s in samples}) < len(samples)
    if share and shared and can_share_prompts(model):
        picked = _shared_prompt_logits(model, samples, pad_id, device)
    else:
        logits = model(input_ids=ids, attention_mask=attn).logits
        idx = gather[:, :, None].expand(-1, -1, logits.shape[-1])
        picked = torch.gather(logits, 1, idx)  # [B, T, V] at completion positions
    temperature = torch.tensor([float(s.temperature) for s in samples], device=picked.device)
    scaled = picked.float() / temperature[:, None, None]
    if top_p < 1.0:
        with torch.no_grad():  # a sample at a time: the mask's sort needs several [T, V]
            outside = torch.stack([~nucleus_mask(row, top_p) for row in scaled])
            outside.scatter_(-1, targets[:, :, None], False)  # the sampled token is in
        scaled = scaled.masked_fill(outside, float("-inf"))
    logp_all = torch.log_softmax(scaled, dim=-1)
    logp = torch.where(mask, logp_all.gather(-1, targets[:, :, None]).squeeze(-1), 0.0)
    entropy = None
    if with_entropy:  # differentiable only where the loss has an entropy term
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            p = logp_all.exp()
            entropy = -(p * torch.where(p > 0, logp_all, 0.0)).sum(-1)
    return logp, entropy, mask


def can_share_prompts(model) -> bool:
    """Whether the shared-prompt forward computes exactly what the packed one does for
    this model: full causal attention everywhere (a sliding window counts cache
    indices, which differ from positions after padded prompts), rotary positions
    that do not depend on the longest position in the pass, and no gradient
    checkpointing (which drops the cache). Other models take the packed path."""
    c = model.config
    rope = getattr(c, "rope_scaling", None) or getattr(c, "rope_parameters", None) or {}
    return (
        getattr(c, "sliding_window", None) is None
        and all(t == "full_attention" for t in (getattr(c, "layer_types", None) or []))
        and "dynamic" not in str(rope.get("rope_type", rope.get("type", "")))
        and not getattr(model, "is_activation_checkpointing", False)
        and getattr(c, "_attn_implementation", "sdpa") in ("sdpa", "eager")
    )


def _shared_prompt_logits(model, samples: list[Sample], pad_id: int, device) -> torch.Tensor:
    """The logits [B, T, V] that score each completion token, computed with each
    distinct prompt run once: the prompts (right-padded) fill a key/value cache, each
    sample takes its prompt's row of it, and the completions run on top with their
    own positions, the prompt padding masked out. Gradients flow back through the
    shared cache, so they match the packed computation to float error, for
    (prompt + group_size x completion) tokens per group instead of
    group_size x (prompt + completion)."""
    from transformers import DynamicCache

    prompts: dict[tuple, int] = {}
    row = [prompts.setdefault(tuple(s.prompt_tokens), len(prompts)) for s in samples]
    plen = [len(p) for p in prompts]
    width = max(plen)
    cpu = torch.device("cpu")
    p_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=cpu)
    p_attn = torch.zeros((len(prompts), width), dtype=torch.long, device=cpu)
    for i, p in enumerate(prompts):
        p_ids[i, : len(p)] = torch.tensor(p, device=cpu)
        p_attn[i, : len(p)] = 1
    cache = DynamicCache()
    # only the logits at each prompt's last position are used: the LM head runs there alone
    lasts = sorted({p - 1 for p in plen})
    keep = _logits_at(model, torch.tensor(lasts, device=device))
    p_logits = model(
        input_ids=p_ids.to(device), attention_mask=p_attn.to(device),
        **with_cache(model, cache), **keep,
    ).logits  # fmt: skip
    which = torch.tensor(row, device=device)
    cache.batch_select_indices(which)  # one row of keys/values per sample (differentiable)

    comp_width = max(len(s.completion_tokens) for s in samples)
    c_ids = torch.full((len(samples), comp_width), pad_id, dtype=torch.long, device=cpu)
    attn = torch.zeros((len(samples), width + comp_width), dtype=torch.long, device=cpu)
    pos = torch.zeros((len(samples), comp_width), dtype=torch.long, device=cpu)
    for i, s in enumerate(samples):
        n, p = len(s.completion_tokens), plen[row[i]]
        c_ids[i, :n] = torch.tensor(s.completion_tokens, device=cpu)
        attn[i, :p] = 1
        attn[i, width : width + comp_width] = 1  # padding after the completion predicts nothing
        pos[i] = torch.arange(p, p + comp_width, device=cpu)
    # the last completion position predicts nothing
    rest = _logits_at(model, torch.arange(comp_width - 1, device=device))
    c_logits = model(
        input_ids=c_ids.to(device), attention_mask=attn.to(device), position_ids=pos.to(device),
        **with_cache(model, cache), **rest,
    ).logits  # fmt: skip
    if not rest:
        c_logits = c_logits[:, :-1]
    at = {t: k for k, t in enumerate(lasts)} if keep else {t: t for t in lasts}
    first = torch.tensor([at[plen[r] - 1] for r in row], device=device)
    last = p_logits[which, first]  # scores token 0
    return torch.cat([last[:, None], c_logits], dim=1)


def _logits_at(model, positions: torch.Tensor) -> dict:
    """The forward keyword that computes logits at `positions` only (the LM head is a
    large share of a small model's step), where the model takes it; else nothing."""
    import inspect

    kind = type(model)
    takes = _TAKES_LOGITS_TO_KEEP.get(kind)
    if takes is None:
        takes = "logits_to_keep" in inspect.signature(kind.forward).parameters
        _TAKES_LOGITS_TO_KEEP[kind] = takes
    return {"logits_to_keep": positions} if takes else {}


_TAKES_LOGITS_TO_KEEP: dict[type, bool] = {}


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def set_lr(optimizer, cfg: TrainerConfig, step: int) -> float:
    """The learning rate of training step `step` (1, 2, ...): `lr` after a linear warmup
    of `warmup_steps`. Set on every parameter group; returned."""
    lr = cfg.lr * min(1.0, step / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def grpo_update(
    model,
    ref_model,
    optimizer,
    samples: list[Sample],
    cfg: TrainerConfig,
    token_budget: float,
    pad_id: int,
    rank: int = 0,
    world: int = 1,
    top_p: float = 1.0,
) -> StepStats:
    """One update; with `world` > 1, this rank's share of it (trainer/fsdp.py).

    Rank r takes the r-th of `world` consecutive parts of every mini-batch (groups
    stay together for the shared-prompt forward). The loss is a sum over tokens
    divided by a normaliser known for the whole mini-batch, so the ranks' gradients
    add up to the one-rank gradient (FSDP2 sums them: its divide factor is set to
    1). Every rank runs the same number of forward passes, padding with a
    zero-weight micro-batch where its share is shorter, because each sharded
    forward is a collective.
    """
    micro = cfg.micro_batch
    n_mini = min(cfg.optimizer_steps, len(samples))
    minis_all = _split(len(samples), n_mini)
    minis = [
        mini[rank * _ceil(len(mini), world) :][: _ceil(len(mini), world)] for mini in minis_all
    ]
    micros = [_ceil(_ceil(len(mini), world), micro) for mini in minis_all]  # same on every rank
    norms_of = [_normaliser(cfg, [samples[i] for i in mini], token_budget / n_mini)
                for mini in minis_all]  # fmt: skip
    mine = [i for mini in minis for i in mini]  # this rank's samples, in order
    where = {i: k for k, i in enumerate(mine)}
    n_chunks = _ceil(_ceil(len(samples), world) + n_mini, micro)  # no rank has more
    share, steady = cfg.share_prompts, world > 1
    correction = Correction.of(cfg)
    mismatch = Mismatch.zeros(len(samples))
    model.eval()  # no dropout in these models; eval keeps old/new log-probs comparable

    def logprobs(m, mb, with_entropy=False):
        return token_logprobs(
            m, mb, pad_id, with_entropy, share, steady, top_p, cfg.entropy_coef > 0
        )

    def per_chunk(m) -> list[torch.Tensor] | None:
        chunks = _chunks([samples[i] for i in mine], micro)
        out = [logprobs(m, mb)[0] for mb in chunks]
        for _ in range(len(chunks), n_chunks if steady else 0):  # keep collectives in step
            logprobs(m, samples[:1])
        return out

    with torch.no_grad():
        # one optimizer step: the gradient pass's own detached log-probs are π_prox
        prox_all = per_chunk(model) if n_mini > 1 else None
        ref = per_chunk(ref_model) if ref_model is not None else None
    loss_sum = clipped = tokens = ent = kl = 0.0
    norms = []
    for m in range(n_mini):
        optimizer.zero_grad(set_to_none=True)
        mini = minis[m]
        for k in range(micros[m]):
            idx = mini[k * micro : (k + 1) * micro]
            weight = 1.0 if idx else 0.0  # a padding pass: run, add nothing
            idx = idx or [mine[0] if mine else 0]
            mb = [samples[i] for i in idx]
            pos = [where.get(i, 0) for i in idx]
            # prox/ref log-probs were computed per micro-batch of this rank's samples
            ref_mb = _select(ref, pos, micro) if ref is not None and weight else None
            logp, entropy, mask = logprobs(model, mb, with_entropy=True)
            width = logp.shape[1]
            if prox_all is None or not weight:
                prox = logp.detach()
            else:
                prox = _select(prox_all, pos, micro)[:, :width]
            behav = _behav(mb, width, prox)
            is_w, excluded = importance_weights(prox, behav, mask, correction)
            if weight:
                mismatch.add(idx, prox, behav, mask, excluded)
            adv = torch.tensor([s.advantage for s in mb], dtype=logp.dtype, device=logp.device)
            adv = adv[:, None]
            out = step_loss(
                logp, prox, adv, mask, is_w, norms_of[m], cfg, entropy,
                None if ref_mb is None else ref_mb[:, :width],
            )  # fmt: skip
            (out.loss * weight).backward()
            if weight:
                loss_sum += float(out.loss.detach())
                clipped += out.clipped_tokens
                tokens += out.tokens
                ent += out.entropy_sum
                kl += out.kl_sum
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)))
        optimizer.step()
    if world > 1:
        sums = _sum_over_ranks(
            [loss_sum, clipped, tokens, ent, kl, *mismatch.flat()], model_device(model)
        )
        loss_sum, clipped, tokens, ent, kl = sums[:5]
        mismatch = Mismatch.unflat(sums[5:])
    return StepStats(
        loss=loss_sum,
        grad_norm=sum(norms) / len(norms),
        clip_fraction=clipped / max(tokens, 1.0),
        entropy=ent / max(tokens, 1.0),
        kl=kl / max(tokens, 1.0),
        tokens=int(tokens),
        mismatch=mismatch,
    )


def _split(n: int, k: int) -> list[list[int]]:
    """0..n−1 in k consecutive parts whose sizes differ by at most one (none empty)."""
    base, extra = divmod(n, k)
    bounds = [m * base + min(m, extra) for m in range(k + 1)]
    return [list(range(bounds[m], bounds[m + 1])) for m in range(k)]


def _normaliser(cfg: TrainerConfig, mini: list[Sample], budget: float) -> float:
    """The divisor of a mini-batch's summed loss (trainer/losses/__init__.py)."""
    kind = losses.get(cfg.loss).NORMALISER
    if kind == "budget":
        return budget
    if kind == "tokens":
        return float(max(sum(s.model_tokens for s in mini), 1))
    return float(max(len(mini), 1))


def _behav(mb: list[Sample], width: int, prox: torch.Tensor) -> torch.Tensor:
    """The recorded sampling log-probs [B, width]; where a sample has none, π_prox
    itself (weight 1, no mismatch)."""
    out = prox.detach().clone()
    for i, s in enumerate(mb):
        if s.behav_logprobs is not None:
            n = len(s.behav_logprobs)
            out[i, :n] = torch.tensor(s.behav_logprobs, dtype=out.dtype, device=out.device)
    return out


def _sum_over_ranks(values: list[float], device) -> list[float]:
    """The sums over the ranks (on the process group's device: NCCL takes only CUDA
    tensors, gloo CPU ones)."""
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _select(chunks: list[torch.Tensor], idx: list[int], micro: int) -> torch.Tensor:
    """Rows `idx` of the concatenation of per-micro-batch tensors (padded to one width)."""
    width = max(c.shape[1] for c in chunks)
    rows = []
    for i in idx:
        c = chunks[i // micro][i % micro]
        rows.append(torch.nn.functional.pad(c, (0, width - c.shape[0])))
    return torch.stack(rows)
