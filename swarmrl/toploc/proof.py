"""TOPLOC proofs, byte for byte the published format (../shared/TOPLOC.md).

A sample's last hidden states (output of the final norm, bfloat16, one row per
generated token) are cut into chunks of 32 rows. For each chunk: the top-k
(k = 128) entries by magnitude of the token-major flattened chunk; the largest
modulus m <= 65497 under which their flat indices stay distinct; the
polynomial through (index mod m, raw bf16 bits) over GF(65497); encoded as m
then the k coefficients, all unsigned 16-bit big-endian (258 bytes). A
sample's proof is its chunk proofs concatenated.

Verification recomputes the top-k of the verifier's own hidden states,
evaluates the polynomial at its own indices and compares exponent and mantissa
fields (the sign is not compared). Thresholds default to the published ones.

Decision: a chunk with fewer than k entries in all (a tiny model's last chunk
of one token) commits to all its entries: k becomes the entry count and the
proof is 2 + 2k bytes. Real models (H >= 128) never hit this.

Scope of this file: building and checking proofs from hidden states. Capturing
the hidden states during generation, the sampling check and the validator are
the rest of issue 4 and not written yet.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import numpy as np
import torch

from swarmrl.toploc.poly import P, evaluate, interpolate

CHUNK = 32
TOPK = 128


@dataclass(frozen=True)
class Thresholds:
    max_exp_mismatches: int = 38
    max_mantissa_mean: float = 10.0
    max_mantissa_median: float = 8.0


@dataclass(frozen=True)
class ChunkCheck:
    exp_mismatches: int
    mantissa_mean: float
    mantissa_median: float
    accepted: bool


def _bf16_bits(values: torch.Tensor) -> np.ndarray:
    return (values.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF).numpy()


def _topk(chunk: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat token-major indices and bf16 bit patterns of the k largest |entries|."""
    flat = chunk.to(torch.bfloat16).reshape(-1)
    k = min(k, flat.numel())
    idx = torch.topk(flat.float().abs(), k, sorted=True).indices
    return idx.numpy().astype(np.int64), _bf16_bits(flat[idx])


def injective_modulus(indices: np.ndarray) -> int:
    """The largest m <= P for which the indices are pairwise distinct mod m."""
    n = len(indices)
    for m in range(P, n - 1, -1):
        if len(np.unique(indices % m)) == n:
            return m
    raise ValueError("no injective modulus")  # impossible: m = max index + 1 works


def encode(modulus: int, coefficients: np.ndarray) -> bytes:
    return struct.pack(f">H{len(coefficients)}H", modulus, *map(int, coefficients))


def decode(proof: bytes) -> tuple[int, np.ndarray]:
    if len(proof) < 4 or len(proof) % 2:
        raise ValueError(f"a proof is 2 + 2k bytes, got {len(proof)}")
    values = struct.unpack(f">{len(proof) // 2}H", proof)
    return values[0], np.array(values[1:], dtype=np.int64)


def build_chunk_proof(chunk: torch.Tensor, k: int = TOPK) -> bytes:
    """Proof of one chunk: `chunk` is (t <= 32, H) hidden states."""
    idx, bits = _topk(chunk, k)
    m = injective_modulus(idx)
    return encode(m, interpolate(idx % m, bits))


def check_chunk_proof(
    proof: bytes, chunk: torch.Tensor, thresholds: Thresholds = Thresholds()
) -> ChunkCheck:
    m, coef = decode(proof)
    idx, own = _topk(chunk, len(coef))
    if len(idx) != len(coef):
        return ChunkCheck(len(coef), float("inf"), float("inf"), False)
    claimed = evaluate(coef, idx % m)
    exp_claimed, exp_own = (claimed & 0x7F80) >> 7, (own & 0x7F80) >> 7
    same_exp = exp_claimed == exp_own
    mismatches = int((~same_exp).sum())
    if not same_exp.any():
        return ChunkCheck(mismatches, float("inf"), float("inf"), False)
    err = np.abs((claimed & 0x7F) - (own & 0x7F))[same_exp]
    mean, median = float(err.mean()), float(np.median(err))
    ok = (
        mismatches <= thresholds.max_exp_mismatches
        and mean <= thresholds.max_mantissa_mean
        and median <= thresholds.max_mantissa_median
    )
    return ChunkCheck(mismatches, mean, median, ok)


def chunk_sizes(n_tokens: int, hidden: int, k: int = TOPK) -> list[int]:
    """Byte size of each chunk proof of a sample: n_tokens generated, hidden size H."""
    return [
        2 + 2 * min(k, min(CHUNK, n_tokens - start) * hidden) for start in range(0, n_tokens, CHUNK)
    ]


def build_proofs(hidden: torch.Tensor, k: int = TOPK) -> bytes:
    """All chunk proofs of one sample: `hidden` is (n_generated, H)."""
    return build_proofs_many([hidden], k)[0]


def build_proofs_many(samples: list[torch.Tensor], k: int = TOPK) -> list[bytes]:
    """Proofs of many samples at once: the chunks that commit to the same
    number of points are interpolated together, in one batch of vector operations."""
    chunks = [(i, h[s : s + CHUNK]) for i, h in enumerate(samples) for s in range(0, len(h), CHUNK)]
    points = [_topk(c, k) for _, c in chunks]
    moduli = [injective_modulus(idx) for idx, _ in points]
    encoded: list[bytes] = [b""] * len(chunks)
    by_k: dict[int, list[int]] = {}
    for j, (idx, _) in enumerate(points):
        by_k.setdefault(len(idx), []).append(j)
    for members in by_k.values():
        x = np.stack([points[j][0] % moduli[j] for j in members])
        y = np.stack([points[j][1] for j in members])
        for j, coef in zip(members, interpolate(x, y), strict=True):
            encoded[j] = encode(moduli[j], coef)
    out = [b""] * len(samples)
    for (i, _), proof in zip(chunks, encoded, strict=True):
        out[i] += proof
    return out


def check_proofs(
    proofs: bytes, hidden: torch.Tensor, k: int = TOPK, thresholds: Thresholds = Thresholds()
) -> list[ChunkCheck]:
    """Check a sample's proofs against the verifier's own hidden states."""
    sizes = chunk_sizes(len(hidden), hidden.shape[-1], k)
    if len(proofs) != sum(sizes):
        raise ValueError(f"proofs are {len(proofs)} bytes, expected {sum(sizes)}")
    out, pos = [], 0
    for i, size in enumerate(sizes):
        chunk = hidden[i * CHUNK : (i + 1) * CHUNK]
        out.append(check_chunk_proof(proofs[pos : pos + size], chunk, thresholds))
        pos += size
    return out


def to_base64(proof: bytes) -> str:
    return base64.b64encode(proof).decode()
