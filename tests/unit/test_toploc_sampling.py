"""Seeded Gumbel-max sampling: the noise, the distribution it samples, and the validator's check."""

from __future__ import annotations

import math

import torch

from swarmrl.toploc.sampling import check_sampling, gumbel_noise, gumbel_sample, sample_seed


def test_noise_depends_only_on_seed_position_and_token():
    seeds = torch.tensor([5, 5, 6, 5])
    pos = torch.tensor([0, 1, 0, 0])
    g = gumbel_noise(seeds, pos, 50)
    assert torch.equal(g[0], g[3])  # same (seed, position): same noise, wherever it sits
    assert not torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2])
    alone = gumbel_noise(torch.tensor([6]), torch.tensor([0]), 50)
    assert torch.equal(alone[0], g[2])  # batch-independent
    wider = gumbel_noise(torch.tensor([5]), torch.tensor([0]), 80)
    assert torch.equal(wider[0, :50], g[0])  # token v's noise does not depend on the vocab size


def test_noise_is_the_documented_formula_bit_for_bit():
    """The protocol's noise, written plainly (whole arrays, new tensors per step): the
    blocked in-place version must give the same float32 values, whatever the batch."""
    from swarmrl.toploc import sampling as S

    def low(z, k):
        return (z >> k) & ((1 << (64 - k)) - 1)

    def mix(z):
        z = (z ^ low(z, 30)) * S._M1
        z = (z ^ low(z, 27)) * S._M2
        return z ^ low(z, 31)

    for n, vocab in ((3, 50), (40, 9000), (7, 49152)):
        seeds = torch.randint(0, 2**62, (n,))
        pos = torch.randint(0, 4096, (n,))
        v = torch.arange(1, vocab + 1, dtype=torch.int64) * S._GOLDEN
        z = mix(mix(seeds + pos * S._GOLDEN)[:, None] ^ v[None, :])
        u = (low(z, 11).to(torch.float64) + 0.5) * (2.0**-53)
        plain = (-torch.log(-torch.log(u))).to(torch.float32)
        assert torch.equal(gumbel_noise(seeds, pos, vocab), plain)
    # Golden values (float32, from the first implementation): the formula itself must
    # not drift, or validators would reject the files of workers on another version.
    g = gumbel_noise(torch.tensor([0, 12345, 2**61 + 7]), torch.tensor([0, 3, 4095]), 49152)
    golden = [
        [2.086843729019165, 0.17385007441043854, -0.4539150893688202, 0.7244889736175537],
        [-1.2563481330871582, -0.8012903928756714, 1.2707065343856812, 0.6162629127502441],
        [0.7789883017539978, 2.255561351776123, 2.680138349533081, 2.5813968181610107],
    ]
    assert g[:, [0, 1, 99, 49151]].tolist() == golden


def test_noise_is_standard_gumbel():
    g = gumbel_noise(torch.arange(200), torch.zeros(200, dtype=torch.long), 1000).double()
    assert abs(float(g.mean()) - 0.5772) < 0.01  # Euler-Mascheroni constant
    assert abs(float(g.var()) - math.pi**2 / 6) < 0.03


def test_gumbel_max_draws_from_the_softmax():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 40_000
    logits = probs.log().expand(n, 4)
    tok, logp = gumbel_sample(logits, torch.arange(n), torch.zeros(n, dtype=torch.long), 1.0, 1.0)
    freq = torch.bincount(tok, minlength=4).double() / n
    assert torch.allclose(freq, probs.double(), atol=0.01), freq
    assert torch.allclose(logp, probs.log()[tok], atol=1e-6)


def test_temperature_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(4000, 4)
    seeds, pos = torch.arange(4000), torch.zeros(4000, dtype=torch.long)
    cold, _ = gumbel_sample(logits, seeds, pos, 0.05, 1.0)
    assert (cold == 0).float().mean() > 0.99
    nucleus, _ = gumbel_sample(logits, seeds, pos, 1.0, 0.7)  # p = .64, .24, ...: keeps 2
    assert set(nucleus.tolist()) == {0, 1}


def _seeded_completion(logits: torch.Tensor, seed: int, temperature=1.0, top_p=1.0):
    n = len(logits)
    tok, _ = gumbel_sample(logits, torch.full((n,), seed), torch.arange(n), temperature, top_p)
    return tok


def test_check_accepts_the_seeded_tokens_and_rejects_others():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(30, 64, generator=gen) * 2
    seed = sample_seed(123, 0, 1)
    tok = _seeded_completion(logits, seed)
    ok = check_sampling(logits, tok, seed, 1.0, 1.0)
    assert ok.failures == 0 and ok.worst_margin == 0.0
    # small errors in the validator's logits are within the tolerance
    noisy = logits + torch.randn(30, 64, generator=gen) * 1e-4
    assert check_sampling(noisy, tok, seed, 1.0, 1.0).failures == 0
    # another seed, or one token swapped for the second-best choice, is caught
    assert check_sampling(logits, tok, seed + 1, 1.0, 1.0).failures > 5
    scores = logits + gumbel_noise(torch.full((30,), seed), torch.arange(30), 64)
    second = scores.topk(2, dim=-1).indices[:, 1]
    swapped = tok.clone()
    swapped[7] = second[7]
    bad = check_sampling(logits, swapped, seed, 1.0, 1.0)
    assert bad.failures == 1 and bad.worst_margin > 0.0


def test_near_ties_within_the_tolerance_pass():
    seed = 9
    noise = gumbel_noise(torch.tensor([seed]), torch.tensor([0]), 8)[0]
    logits = -noise.clone()  # every score exactly 0: a perfect tie
    logits[3] += 0.004  # token 3 wins by 0.004
    tok = torch.tensor([5])  # a worker whose logits put token 5 ahead by a hair
    assert check_sampling(logits[None], tok, seed, 1.0, 1.0, tolerance=0.01).failures == 0
    assert check_sampling(logits[None], tok, seed, 1.0, 1.0, tolerance=0.001).failures == 1


def test_top_p_check_rejects_tokens_outside_the_nucleus():
    logits = torch.tensor([[3.0, 2.9, -2.0, -3.0]]).repeat(20, 1)
    seed = 4
    tok = _seeded_completion(logits, seed, top_p=0.5)
    assert check_sampling(logits, tok, seed, 1.0, 0.5).failures == 0
    outside = torch.full_like(tok, 3)
    assert check_sampling(logits, outside, seed, 1.0, 0.5).failures == 20


def test_non_finite_logits_fail_the_check():
    logits = torch.full((4, 16), float("nan"))
    assert check_sampling(logits, torch.zeros(4, dtype=torch.long), 1, 1.0, 1.0).failures == 4


def test_top_p_boundary_swaps_within_the_error_pass():
    """Two tokens a hair apart straddle the nucleus edge; the worker's and the
    validator's logits order them differently. The honest token must still pass."""
    base = torch.log(torch.tensor([0.5, 0.25, 0.25, 1e-4]))
    worker = base + torch.tensor([0, 1e-6, 0, 0])
    validator = base + torch.tensor([0, 0, 1e-6, 0])
    checked = 0
    for seed in range(200):
        tok, _ = gumbel_sample(worker[None], torch.tensor([seed]), torch.tensor([0]), 1.0, 0.6)
        if int(tok) == 1:  # in the worker's nucleus, outside the validator's exact one
            checked += 1
            assert check_sampling(validator[None], tok, seed, 1.0, 0.6).failures == 0
    assert checked > 10
    # a token far outside the nucleus still fails
    assert check_sampling(validator[None], torch.tensor([3]), 0, 1.0, 0.6).failures == 1
