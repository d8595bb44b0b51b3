"""One GRPO update on a collected batch.

1. Old log-probs are recomputed with the current weights (the policy before
   this step's update), in micro-batches, without gradient. With one
   optimizer step per batch they equal the detached log-probs of the gradient
   pass (r = 1 exactly), so that extra forward pass is skipped.
2. The batch is split into `optimizer_steps` mini-batches; each is one
   optimizer step, accumulated over micro-batches, with the loss divided by
   the constant token budget (per mini-batch: budget / optimizer_steps).
3. Gradients are clipped by global norm.
Sequences are right-padded; the logits at positions len(prompt)−1 …
len(prompt)+len(completion)−2 score the completion tokens. With
`trainer.share_prompts` (the default), the samples of a micro-batch that share
a prompt (a GRPO group) run it once and their completions on its cached keys
and values (`_shared_prompt_logits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from swarmrl.config import TrainerConfig
from swarmrl.trainer.batch import Sample
from swarmrl.trainer.loss import grpo_loss


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    clip_fraction: float
    entropy: float
    kl: float
    tokens: int


def _pack(samples: list[Sample], pad_id: int):
    seqs = [s.prompt_tokens + s.completion_tokens for s in samples]
    width = max(len(x) for x in seqs)
    comp_width = max(len(s.completion_tokens) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    # index of the logit that predicts each completion token
    gather = torch.zeros((len(samples), comp_width), dtype=torch.long)
    mask = torch.zeros((len(samples), comp_width), dtype=torch.bool)
    for i, (s, x) in enumerate(zip(samples, seqs, strict=True)):
        ids[i, : len(x)] = torch.tensor(x)
        attn[i, : len(x)] = 1
        n, p = len(s.completion_tokens), len(s.prompt_tokens)
        gather[i, :n] = torch.arange(p - 1, p - 1 + n)
        mask[i, :n] = True
    targets = torch.zeros((len(samples), comp_width), dtype=torch.long)
    for i, s in enumerate(samples):
        targets[i, : len(s.completion_tokens)] = torch.tensor(s.completion_tokens)
    return ids, attn, gather, targets, mask


def token_logprobs(
    model,
    samples: list[Sample],
    pad_id: int,
    with_entropy: bool = False,
    share: bool = True,
    steady: bool = False,
):
    """Log-probs [B, T] of each sample's completion tokens (and their entropies), with
    the mask of real tokens. With `share`, each distinct prompt runs once (below).
    `steady`: take the same path whatever the batch holds (a sharded model's forward
    passes are collectives, so every rank must make as many)."""
    ids, attn, gather, targets, mask = _pack(samples, pad_id)
    shared = steady or len({tuple(s.prompt_tokens) for s in samples}) < len(samples)
    if share and shared and can_share_prompts(model):
        picked = _shared_prompt_logits(model, samples, pad_id)
    else:
        logits = model(input_ids=ids, attention_mask=attn).logits
        idx = gather[:, :, None].expand(-1, -1, logits.shape[-1])
        picked = torch.gather(logits, 1, idx)  # [B, T, V] at completion positions
    logp_all = torch.log_softmax(picked.float(), dim=-1)
    logp = logp_all.gather(-1, targets[:, :, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
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


def _shared_prompt_logits(model, samples: list[Sample], pad_id: int) -> torch.Tensor:
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
    p_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    p_attn = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        p_ids[i, : len(p)] = torch.tensor(p)
        p_attn[i, : len(p)] = 1
    cache = DynamicCache()
    p_logits = model(input_ids=p_ids, attention_mask=p_attn, past_key_values=cache).logits
    which = torch.tensor(row)
    cache.batch_select_indices(which)  # one row of keys/values per sample (differentiable)

    comp_width = max(len(s.completion_tokens) for s in samples)
    c_ids = torch.full((len(samples), comp_width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width + comp_width), dtype=torch.long)
    pos = torch.zeros((len(samples), comp_width), dtype=torch.long)
    for i, s in enumerate(samples):
        n, p = len(s.completion_tokens), plen[row[i]]
        c_ids[i, :n] = torch.tensor(s.completion_tokens)
        attn[i, :p] = 1
        attn[i, width : width + comp_width] = 1  # padding after the completion predicts nothing
        pos[i] = torch.arange(p, p + comp_width)
    c_logits = model(
        input_ids=c_ids, attention_mask=attn, position_ids=pos, past_key_values=cache
    ).logits
    last = p_logits[which, torch.tensor([plen[r] - 1 for r in row])]  # scores token 0
    return torch.cat([last[:, None], c_logits[:, :-1]], dim=1)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


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
) -> StepStats:
    """One update; with `world` > 1, this rank's share of it (trainer/fsdp.py).

    Rank r takes the r-th of `world` consecutive parts of every mini-batch (groups
    stay together for the shared-prompt forward). The loss is a sum
    over tokens divided by a constant, so the ranks' gradients add up to the
    one-rank gradient (FSDP2 sums them: its divide factor is set to 1). Every rank
    runs the same number of forward passes, padding with a zero-weight micro-batch
    where its share is shorter, because each sharded forward is a collective.
    """
    micro = cfg.micro_batch
    n_mini = min(cfg.optimizer_steps, len(samples))
    mini_size = -(-len(samples) // n_mini)
    minis_all = [
        list(range(len(samples)))[m * mini_size : (m + 1) * mini_size] for m in range(n_mini)
    ]
    minis = [
        mini[rank * _ceil(len(mini), world) :][: _ceil(len(mini), world)] for mini in minis_all
    ]
    micros = [_ceil(_ceil(len(mini), world), micro) for mini in minis_all]  # same on every rank
    mine = [i for mini in minis for i in mini]  # this rank's samples, in order
    where = {i: k for k, i in enumerate(mine)}
    n_chunks = _ceil(_ceil(len(samples), world) + n_mini, micro)  # no rank has more
    share, steady = cfg.share_prompts, world > 1
    model.eval()  # no dropout in these models; eval keeps old/new log-probs comparable

    def per_chunk(m) -> list[torch.Tensor] | None:
        chunks = _chunks([samples[i] for i in mine], micro)
        out = [token_logprobs(m, mb, pad_id, share=share, steady=steady)[0] for mb in chunks]
        for _ in range(len(chunks), n_chunks if steady else 0):  # keep collectives in step
            token_logprobs(m, samples[:1], pad_id, share=share, steady=steady)
        return out

    with torch.no_grad():
        # one optimizer step: the gradient pass's own detached log-probs
        old = per_chunk(model) if n_mini > 1 else None
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
            # old/ref log-probs were computed per micro-batch of this rank's samples
            ref_mb = _select(ref, pos, micro) if ref is not None and weight else None
            logp, entropy, mask = token_logprobs(
                model, mb, pad_id, with_entropy=True, share=share, steady=steady
            )
            old_mb = logp.detach() if old is None or not weight else _select(old, pos, micro)
            adv = torch.tensor([s.advantage for s in mb], dtype=logp.dtype)[:, None]
            out = grpo_loss(
                logp,
                old_mb[:, : logp.shape[1]],
                adv,
                mask,
                token_budget / n_mini,
                epsilon=cfg.epsilon,
                delta=cfg.delta,
                entropy=entropy,
                entropy_coef=cfg.entropy_coef,
                ref_logp=None if ref_mb is None else ref_mb[:, : logp.shape[1]],
                kl_coef=cfg.kl_coef,
            )
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
        loss_sum, clipped, tokens, ent, kl = _sum_over_ranks([loss_sum, clipped, tokens, ent, kl])
    return StepStats(
        loss=loss_sum,
        grad_norm=sum(norms) / len(norms),
        clip_fraction=clipped / max(tokens, 1.0),
        entropy=ent / max(tokens, 1.0),
        kl=kl / max(tokens, 1.0),
        tokens=int(tokens),
    )


def _sum_over_ranks(values: list[float]) -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
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
