"""Seeded Gumbel-max sampling, and the validator's check of it.

A worker draws token t of a sample as

    token_t = argmax_v ( logits_t[v] / T + g(seed, t, v) )

over the tokens of the nucleus (all of them when top_p = 1), where g is
Gumbel noise that depends only on the sample's seed, the position t in the
completion and the token id v. The seed derives from the assignment (run
seed, node key, step, counter) and the sample's place in the file
(`sample_seed`), so a worker cannot choose it, and a validator that
regenerates g can check every token against its own logits.

The noise is counter-based: a splitmix64 hash of (seed, t, v) in int64
tensor arithmetic (wrapping multiplication), turned into a uniform u in
(0, 1) from the top 53 bits, then g = -log(-log u). It is the same on every
device, for every batch size and batch order, which a stateful generator is
not (torch's CPU and CUDA streams differ).

Near-tie tolerance. The validator's logits come from a prefill, the worker's
from a decode with a KV cache, maybe another batch size, kernel or device:
they differ by a small error e per logit. For an honest token the worker's
score was the maximum, so under the validator's logits it can fall short of
the maximum by at most 2·max|e|/T. The check therefore accepts a token whose
score is within `tolerance` of the best score. An honest worker is never
rejected while the tolerance exceeds twice the logit error (measured: below
1e-4 for float32 on CPU across batch sizes, thread counts and padding,
bench/toploc.py and tests/unit/test_toploc_sampling.py); a token drawn any
other way passes only when its score happens to lie within the tolerance of
the best one, which for a continuous noise has probability about
tolerance × density of the gap, small per token and vanishing over a file.
The default, 0.01 in units of logits/T, is 100x the measured float32 error.
In bfloat16 the errors are far larger (SmolLM2-135M on this CPU: a file's
worst margin up to 0.33), and a per-token tolerance wide enough for them is
wide enough for a token drawn another way on a flat distribution. So the
validator also bounds the file's mean margin (`margin_sum` / `tokens`): an
honest token's margin is zero but at near-ties, a token not drawn with the
seed falls short on most tokens (validator/checks.py, check 8).

With top_p < 1 the nucleus itself can differ at its boundary: two tokens
whose scores differ by less than the error can swap places, and the mass
ahead of a token then jumps by a whole probability. The check bounds the
worker's nucleus with the same error allowance (`_nucleus_bounds`): the chosen
token must be in it for some order the errors allow, and only tokens in it for
every such order compete with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from swarmrl.protocol.seeds import derive_seed

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # as signed int64: the products wrap mod 2^64
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)
_ROWS_PER_BLOCK = 1 << 22  # noise elements per block in the check (keeps memory bounded)


def sample_seed(assignment_seed: int, group: int, index: int) -> int:
    """Seed of sample `index` of prompt group `group` of a file."""
    return derive_seed(assignment_seed, "sample", group, index)


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


_LOW = {k: (1 << (64 - k)) - 1 for k in (11, 27, 30, 31)}  # masks of the logical shifts
_NOISE_BLOCK = 1 << 18  # noise elements computed at once: 2 MB of int64, cache-sized
_TOKEN_KEYS: dict[tuple[int, str], torch.Tensor] = {}  # (v + 1) * golden, per vocab and device


def _mix_(z: torch.Tensor) -> torch.Tensor:
    """`_mix` in place (the same operations, no temporaries per step)."""
    for k, m in ((30, _M1), (27, _M2)):
        t = z >> k
        z ^= t.bitwise_and_(_LOW[k])
        z *= m
    z ^= (z >> 31).bitwise_and_(_LOW[31])
    return z


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Noise g of shape (n, vocab) for n (seed, position) pairs, float32.

    Computed a few rows at a time, in place: the values are those of the formula in
    the module docstring, bit for bit (a test keeps a plain version of it), and a
    batch of 256 rows over a 49k vocabulary takes about a tenth of the time the
    whole-array version took (which streamed 100 MB temporaries per operation)."""
    device = seeds.device
    base = _mix(seeds.to(torch.int64) + positions.to(device=device, dtype=torch.int64) * _GOLDEN)
    keys = _TOKEN_KEYS.get((vocab, str(device)))
    if keys is None:
        keys = torch.arange(1, vocab + 1, dtype=torch.int64, device=device) * _GOLDEN
        _TOKEN_KEYS[(vocab, str(device))] = keys
    out = torch.empty((len(base), vocab), dtype=torch.float32, device=device)
    # On a CPU, blocks that fit the cache; on a GPU, one launch sequence for the batch.
    rows = max(1, _NOISE_BLOCK // vocab) if device.type == "cpu" else len(base)
    for s in range(0, len(base), rows):
        z = _mix_(base[s : s + rows, None] ^ keys[None, :])
        z >>= 11
        u = z.bitwise_and_(_LOW[11]).to(torch.float64)
        del z
        u.add_(0.5).mul_(2.0**-53)
        out[s : s + rows] = u.log_().neg_().log_().neg_()
    return out


def nucleus_mask(scaled: torch.Tensor, top_p: float, slack: float = 0.0) -> torch.Tensor:
    """True for tokens whose preceding probability mass is below top_p + slack."""
    probs = torch.softmax(scaled, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep_sorted = sorted_p.cumsum(-1) - sorted_p < top_p + slack
    keep_sorted[..., 0] = True  # the most probable token is always in
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def gumbel_sample(
    logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, temperature: float, top_p
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their log-probs under the distribution sampled (`sampling_logprobs`)
    for a batch of rows."""
    scaled = logits.float() / temperature
    scores = scaled + gumbel_noise(seeds, positions, scaled.shape[-1])
    if top_p < 1.0:
        scores = scores.masked_fill(~nucleus_mask(scaled, top_p), float("-inf"))
    token = scores.argmax(dim=-1)
    return token, sampling_logprobs(logits, token, temperature, top_p)


def sampling_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    """log p(token) under softmax(logits / T) renormalised over the nucleus of top_p (the
    whole vocabulary at top_p = 1): the probability with which the token was drawn.
    Rows (n, V) and tokens (n,). The token itself always counts as in the nucleus (it
    was drawn from it; a validator's rounding may put it just outside). The worker
    records this, the validator recomputes it, and the trainer's log-probs are the same
    function (trainer/step.py)."""
    scaled = logits.float() / temperature
    if top_p < 1.0:
        outside = (~nucleus_mask(scaled, top_p)).scatter_(-1, tokens[:, None], False)
        scaled = scaled.masked_fill(outside, float("-inf"))
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)


@dataclass(frozen=True)
class SamplingCheck:
    failures: int  # tokens that were not the seeded choice (beyond the tolerance)
    worst_margin: float  # largest shortfall of a chosen token's score below the best score
    margin_sum: float = 0.0  # the shortfalls summed over the completion's tokens
    tokens: int = 0
    behind: torch.Tensor | None = None  # (n,) bool: the token's score is below the best


def check_sampling(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    seed: int,
    temperature: float,
    top_p: float,
    tolerance: float = 0.01,
    positions: torch.Tensor | None = None,
) -> SamplingCheck:
    """Check one completion: `logits` (n, V) are the validator's at the n generated
    positions; `positions`, when given, are those positions' places in the completion
    (a trajectory's model tokens: inference/trajectory.py), else 0 .. n-1."""
    n, vocab = logits.shape
    failures, worst, total, behind = 0, 0.0, 0.0, []
    block = max(1, _ROWS_PER_BLOCK // vocab)
    for s in range(0, n, block):
        rows = logits[s : s + block].float() / temperature
        tok = tokens[s : s + block].to(device=rows.device, dtype=torch.long)
        seeds = torch.full((len(rows),), seed, dtype=torch.int64, device=rows.device)
        at = (
            torch.arange(s, s + len(rows), device=rows.device)
            if positions is None
            else positions[s : s + len(rows)].to(device=rows.device, dtype=torch.int64)
        )
        scores = rows + gumbel_noise(seeds, at, vocab)
        chosen = scores.gather(-1, tok[:, None]).squeeze(-1)
        competitors = scores
        if top_p < 1.0:
            maybe_in, surely_in = _nucleus_bounds(rows, tok, top_p, tolerance)
            chosen = chosen.masked_fill(~maybe_in, float("-inf"))
            competitors = scores.masked_fill(~surely_in, float("-inf"))
        best = torch.maximum(competitors.max(dim=-1).values, chosen)
        margin = best - chosen
        failures += int((~(margin <= tolerance)).sum())  # NaN fails
        worst = max(worst, float(margin.max()))
        total += float(margin.sum())
        behind.append((margin > 0).cpu())
    return SamplingCheck(failures, worst, total, n, torch.cat(behind) if behind else None)


def _nucleus_bounds(scaled: torch.Tensor, tok: torch.Tensor, top_p: float, tolerance: float):
    """Which tokens were in the worker's nucleus, allowing each of its scaled logits to
    differ from ours by tolerance/2 (the same error the near-tie tolerance allows).

    Token u is ahead of token v in the worker's order for certain when our scores
    differ by more than `tolerance`, and each probability is off by a factor of at
    most e^tolerance. So the chosen token may have been in the nucleus when the
    mass surely ahead of it, shrunk by e^-tolerance, is below top_p; a competitor
    was in it for certain when all the mass that may be ahead of it, grown by
    e^tolerance, is below top_p. Returns (chosen may be in (n,), surely in (n, V))."""
    probs = torch.softmax(scaled, dim=-1)
    desc, order = scaled.sort(dim=-1, descending=True)
    cum = torch.cat([torch.zeros_like(probs[:, :1]), probs.gather(-1, order).cumsum(-1)], dim=-1)
    neg = (-desc).contiguous()  # ascending, for searchsorted

    def mass_above(threshold: torch.Tensor, inclusive: bool) -> torch.Tensor:
        count = torch.searchsorted(neg, (-threshold).contiguous(), right=inclusive)
        return cum.gather(-1, count)

    s_tok = scaled.gather(-1, tok[:, None])
    sure_ahead = mass_above(s_tok + tolerance, inclusive=False).squeeze(-1)
    maybe_in = sure_ahead * math.exp(-tolerance) < top_p
    maybe_ahead = mass_above(scaled - tolerance, inclusive=True) - probs  # minus the token itself
    surely_in = maybe_ahead * math.exp(tolerance) < top_p
    return maybe_in, surely_in
