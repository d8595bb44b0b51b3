"""What a generation returns, and the one decoding loop over a transformers model.

`decode` is the token loop of every generator that runs a transformers model:
the worker's `HFBackend` (seeded Gumbel-max, with TOPLOC proofs), `swarmrl
eval` (greedy) and `swarmrl filter` (multinomial sampling, as transformers'
`generate` samples). They differ only in how a token is chosen from the
logits, which the caller passes as `choose`; the loop owns the rest:

- Prompts are left-padded into one batch; position ids count the real tokens
  (0 at the padding, which the attention mask hides); one forward over the
  prompts, then one cached forward per new token (`DynamicCache`), keeping
  only the last position's logits.
- The one EOS rule: a row ends at the first token of `stop_ids` it draws; that
  token is the row's last (`Completion.finished`), and the row is fed
  `pad_id` from then on. A row that draws none stops at `max_new_tokens`.
  The loop stops when every row has ended, so `choose` sees the whole batch
  at every step (a stateful sampler draws the same random numbers whatever
  finishes when).

Hidden states are not the loop's business: `HFBackend` hooks the model's
final norm around the call (inference/hf.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    finished: bool  # ended on EOS (False: stopped at the length limit)
    proofs: bytes = b""  # TOPLOC proofs of the generated positions (when asked for)
    mask: list[int] | None = None  # 1: the model's token, 0: an environment's; None: all 1


# choose(logits (b, V) at the last position, step t) -> (tokens (b,), their log-probs (b,)):
# tensors; the step counts from 0 at the first generated token.
Choose = Callable[[Any, int], tuple[Any, Any]]


def with_cache(model, cache) -> dict:
    """The forward keyword that takes a key/value cache: `cache` from transformers 5.24
    (where `past_key_values` is deprecated and warns), `past_key_values` before it
    (vLLM keeps transformers below 5.20)."""
    import inspect

    kind = type(model)
    name = _CACHE_KW.get(kind)
    if name is None:
        params = inspect.signature(kind.forward).parameters
        name = _CACHE_KW[kind] = "cache" if "cache" in params else "past_key_values"
    return {name: cache}


_CACHE_KW: dict[type, str] = {}


def greedy(logits, step: int):
    """The argmax token of each row (the first on a tie), with its log-prob under
    softmax(logits)."""
    import torch

    scores = logits.to(dtype=torch.float32)
    token = scores.argmax(dim=-1)
    return token, torch.log_softmax(scores, dim=-1).gather(-1, token[:, None]).squeeze(-1)


def distinct_prompts(prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """(the first row of each distinct prompt, each row's place among them)."""
    place: dict[tuple[int, ...], int] = {}
    firsts: list[int] = []
    for row, p in enumerate(prompts):
        if tuple(p) not in place:
            place[tuple(p)] = len(firsts)
            firsts.append(row)
    return firsts, [place[tuple(p)] for p in prompts]


def decode(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    choose: Choose,
    stop_ids: list[int],
    pad_id: int,
    ends=None,
    share_prompts: bool = False,
) -> list[Completion]:
    """One completion per prompt, each token picked by `choose` (module docstring).
    `ends(row, tokens)`, when given, also ends a row after a token (a trajectory's
    span that ends with a tool call: inference/trajectory.py); such a row is not
    `finished` (it did not draw a stop token). With `share_prompts`, each distinct
    prompt is run once and its rows decode from copies of its keys and values (a
    group's samples share their prompt: the prompt pass was half of a file's
    generation); a forward hook then sees the prompt pass's rows of
    `distinct_prompts(prompts)[0]` only."""
    import torch
    from transformers import DynamicCache

    device = model.device
    b = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    ids, attn = ids.to(device), attn.to(device)
    stop = torch.tensor(stop_ids, dtype=torch.long, device=device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    tokens = torch.empty((b, 0), dtype=torch.long, device=device)
    logps = torch.empty((b, 0), dtype=torch.float32, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    lengths = torch.full((b,), max_new_tokens, dtype=torch.long, device=device)
    cut = [False] * b  # ended by `ends`
    cache = DynamicCache()
    firsts, index = distinct_prompts(prompts) if share_prompts else (list(range(b)), None)
    with torch.no_grad():
        rows = torch.tensor(firsts, device=device)
        logits = model(
            input_ids=ids[rows],
            attention_mask=attn[rows],
            position_ids=pos[rows],
            **with_cache(model, cache),
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        if len(firsts) < b:  # every row from its prompt's keys, values and logits
            place = torch.tensor(index, device=device)
            cache.reorder_cache(place)
            logits = logits[place]
        for t in range(max_new_tokens):
            tok, lp = choose(logits, t)
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            tokens = torch.cat([tokens, tok[:, None]], dim=1)
            logps = torch.cat([logps, lp[:, None].to(torch.float32)], dim=1)
            newly = (~done) & torch.isin(tok, stop)
            lengths = torch.where(newly, torch.full_like(lengths, t + 1), lengths)
            done = done | newly
            if ends is not None:
                for i in (~done).nonzero().flatten().tolist():
                    if ends(i, tokens[i].tolist()):
                        lengths[i], done[i] = t + 1, True
                        cut[i] = True
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            pos = pos[:, -1:] + 1
            logits = model(
                input_ids=tok[:, None],
                attention_mask=attn,
                position_ids=pos,
                **with_cache(model, cache),
                use_cache=True,
            ).logits[:, -1]
    n = [int(x) for x in lengths]
    return [
        Completion(
            tokens[i, : n[i]].tolist(), logps[i, : n[i]].tolist(), bool(done[i]) and not cut[i]
        )
        for i in range(b)
    ]
