"""TOPLOC proof format and arithmetic, on hand-computed numbers and the example of docs/toploc.md."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from swarmrl.toploc.poly import P, evaluate, interpolate, inverse
from swarmrl.toploc.proof import (
    build_chunk_proof,
    build_proofs,
    build_proofs_many,
    check_chunk_proof,
    check_proofs,
    check_proofs_many,
    chunk_sizes,
    decode,
    encode,
    injective_modulus,
)

EXAMPLE = bytes.fromhex("ffd91b422b67ba4b756d")  # docs/toploc.md: k = 4


def test_example_of_the_spec_decodes_and_reencodes():
    m, coef = decode(EXAMPLE)
    assert m == 65497 and coef.tolist() == [6978, 11111, 47691, 30061]
    assert encode(m, coef) == EXAMPLE
    assert base64.b64encode(EXAMPLE).decode() == "/9kbQitnukt1bQ=="


def test_interpolation_by_hand_and_through_the_example_polynomial():
    # through (0,1), (1,3), (2,7): x^2 + x + 1
    assert interpolate([0, 1, 2], [1, 3, 7]).tolist() == [1, 1, 1]
    # the example's polynomial at x = 2, by hand:
    # 6978 + 11111*2 + 47691*4 + 30061*8 = 460452 = 7*65497 + 1973
    coef = np.array([6978, 11111, 47691, 30061])
    x = np.array([2, 5, 1000, 65496])
    y = evaluate(coef, x)
    assert y[0] == 1973
    assert interpolate(x, y).tolist() == coef.tolist()  # the points give the polynomial back
    assert inverse(np.array([2]))[0] * 2 % P == 1


def test_interpolation_of_128_points_passes_through_all_of_them():
    rng = np.random.default_rng(0)
    x = rng.choice(P, 128, replace=False)
    y = rng.integers(0, P, 128)
    coef = interpolate(x, y)
    assert len(coef) == 128 and (evaluate(coef, x) == y).all()


def test_modulus_counts_down_until_indices_are_distinct():
    assert injective_modulus(np.array([1, 2, 3])) == 65497
    assert injective_modulus(np.array([0, 65497, 7])) == 65496  # 0 and 65497 collide mod 65497
    idx = np.array([5, 70000, 135497])
    m = injective_modulus(idx)
    assert len(set((idx % m).tolist())) == 3 and all(
        len(set((idx % mm).tolist())) < 3 for mm in range(m + 1, P + 1)
    )


def _hidden(n: int, h: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, h, generator=g).to(torch.bfloat16)


def test_honest_proofs_pass_and_are_258_bytes_per_chunk():
    hidden = _hidden(70, 256, 0)  # 3 chunks: 32 + 32 + 6 tokens
    proofs = build_proofs(hidden)
    assert len(proofs) == 3 * 258 == sum(chunk_sizes(70, 256))
    checks = check_proofs(proofs, hidden)
    assert all(c.accepted and c.exp_mismatches == 0 and c.mantissa_mean == 0 for c in checks)


def test_low_mantissa_noise_passes_other_states_fail():
    hidden = _hidden(64, 256, 0)
    proofs = build_proofs(hidden)
    # another kernel / batch size: relative error ~2^-8 changes the last mantissa bits
    g = torch.Generator().manual_seed(1)
    noisy = (hidden.float() * (1 + 2**-8 * torch.randn(hidden.shape, generator=g))).to(
        torch.bfloat16
    )
    assert all(c.accepted for c in check_proofs(proofs, noisy))
    other = _hidden(64, 256, 2)  # another model, prompt or sampler
    assert not any(c.accepted for c in check_proofs(proofs, other))
    half = (hidden.float() * 0.5).to(torch.bfloat16)  # same mantissas, other exponents
    assert not any(c.accepted for c in check_proofs(proofs, half))


def test_small_hidden_size_commits_to_every_entry_and_wrong_lengths_are_refused():
    hidden = _hidden(33, 64, 0)  # last chunk: 1 token x 64 entries < 128
    proofs = build_proofs(hidden)
    assert chunk_sizes(33, 64) == [258, 130] and len(proofs) == 388
    assert all(c.accepted for c in check_proofs(proofs, hidden))
    with pytest.raises(ValueError, match="expected"):
        check_proofs(proofs[:-2], hidden)
    # a chunk with fewer entries than the proof commits to cannot be checked: rejected
    assert not check_chunk_proof(proofs[258:] + b"\0\0" * 100, hidden[32:]).accepted


def test_batched_building_equals_one_by_one():
    from swarmrl.toploc.proof import build_chunk_proof, build_proofs_many

    samples = [_hidden(n, 64, seed) for seed, n in enumerate([1, 5, 32, 33, 70])]
    batched = build_proofs_many(samples)
    for h, proofs in zip(samples, batched, strict=True):
        one = b"".join(build_chunk_proof(h[s : s + 32]) for s in range(0, len(h), 32))
        assert proofs == one
        assert all(c.accepted for c in check_proofs(proofs, h))


def test_batched_building_and_checking_equal_chunk_by_chunk():
    gen = torch.Generator().manual_seed(3)
    samples = [torch.randn(n, 96, generator=gen) for n in (1, 31, 32, 33, 64, 70)]
    many = build_proofs_many(samples)
    for h, proofs in zip(samples, many, strict=True):
        one_by_one = b"".join(build_chunk_proof(h[s : s + 32]) for s in range(0, len(h), 32))
        assert proofs == one_by_one
    checks = check_proofs_many(many, samples)
    assert [len(c) for c in checks] == [1, 1, 1, 2, 2, 3]
    assert all(c.accepted for cs in checks for c in cs)
    swapped = check_proofs_many(many[::-1], samples[::-1])
    assert all(c.accepted for cs in swapped for c in cs)


def test_wide_chunks_search_the_modulus_down():
    """32 x 5120 entries: indices above 65497 can collide mod 65497; the modulus found
    is the largest that keeps them apart, and the proof still checks."""
    chunk = torch.zeros(32, 5120)
    chunk.view(-1)[torch.tensor([5, 5 + 65497, 5 + 2 * 65497])] = torch.tensor([9.0, -8.0, 7.0])
    chunk.view(-1)[1000:1125] = torch.linspace(1.0, 2.0, 125)
    proof = build_chunk_proof(chunk)
    m, _ = decode(proof)
    idx = torch.topk(chunk.reshape(-1).abs(), 128).indices.numpy()
    assert m < 65497 and m == injective_modulus(idx)
    assert len(set((idx % m).tolist())) == 128
    assert all(len(set((idx % bigger).tolist())) < 128 for bigger in range(m + 1, 65498))
    assert check_chunk_proof(proof, chunk).accepted


def test_a_forged_modulus_is_refused():
    with pytest.raises(ValueError):
        decode(b"\x00\x00" + b"\x00\x01" * 4)
    with pytest.raises(ValueError):
        decode(b"\xff\xff" + b"\x00\x01" * 4)
