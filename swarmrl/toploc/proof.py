"""TOPLOC proofs, byte for byte the published format (docs/toploc.md).

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

Both directions are batched: the chunks of many samples that have the same
length are stacked and go through top-k, the modulus search, interpolation or
evaluation, and encoding as whole arrays. Hidden states are captured during
generation by inference/hf.py; the sampling check is toploc/sampling.py.
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


def _topk(chunks: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat token-major indices and bf16 bit patterns of the k largest |entries|
    of each chunk: `chunks` is (n, t, H), the results (n, k). Magnitudes are
    compared as the low 15 bits of the bf16 patterns, which order like |value|
    (sign-magnitude format), so no float conversion is needed."""
    bits = chunks.to(torch.bfloat16).reshape(len(chunks), -1).view(torch.int16).to(torch.int32)
    bits &= 0xFFFF
    k = min(k, bits.shape[1])
    idx = torch.topk(bits & 0x7FFF, k, dim=-1, sorted=True).indices
    return idx.numpy().astype(np.int64), bits.gather(-1, idx).numpy()


def injective_moduli(indices: np.ndarray) -> np.ndarray:
    """For each row of indices, the largest m <= P under which the row stays distinct.
    Rows whose indices are all below P take P at once; the others count down
    together, each leaving the search as soon as it is injective."""
    n, k = indices.shape
    moduli = np.zeros(n, dtype=np.int64)
    todo = np.arange(n)
    for m in range(P, k - 1, -1):
        if len(todo) == 0:
            break
        r = np.sort(indices[todo] % m, axis=-1)
        ok = (np.diff(r, axis=-1) != 0).all(axis=-1)
        moduli[todo[ok]] = m
        todo = todo[~ok]
    if len(todo):
        raise ValueError("no injective modulus")  # impossible: m = max index + 1 works
    return moduli


def injective_modulus(indices: np.ndarray) -> int:
    """The largest m <= P for which the indices are pairwise distinct mod m."""
    return int(injective_moduli(np.asarray(indices, dtype=np.int64)[None, :])[0])


def encode(modulus: int, coefficients: np.ndarray) -> bytes:
    return struct.pack(f">H{len(coefficients)}H", modulus, *map(int, coefficients))


def decode(proof: bytes) -> tuple[int, np.ndarray]:
    if len(proof) < 4 or len(proof) % 2:
        raise ValueError(f"a proof is 2 + 2k bytes, got {len(proof)}")
    values = np.frombuffer(proof, dtype=">u2").astype(np.int64)
    if not 2 <= values[0] <= P:
        raise ValueError(f"proof modulus {values[0]} is outside [2, {P}]")
    return int(values[0]), values[1:]


def build_chunk_proof(chunk: torch.Tensor, k: int = TOPK) -> bytes:
    """Proof of one chunk: `chunk` is (t <= 32, H) hidden states."""
    return _build_same_shape(chunk[None], k)[0]


def _build_same_shape(chunks: torch.Tensor, k: int) -> list[bytes]:
    """Proofs of n chunks of equal shape (n, t, H), in one batch of vector operations."""
    idx, bits = _topk(chunks, k)
    moduli = injective_moduli(idx)
    coef = interpolate(idx % moduli[:, None], bits)
    words = np.concatenate([moduli[:, None], coef], axis=1).astype(">u2")
    return [row.tobytes() for row in words]


def _chunks(samples: list[torch.Tensor]) -> dict[int, list[tuple[int, int]]]:
    """(sample, start) of every chunk, grouped by chunk length."""
    by_len: dict[int, list[tuple[int, int]]] = {}
    for i, h in enumerate(samples):
        for s in range(0, len(h), CHUNK):
            by_len.setdefault(min(CHUNK, len(h) - s), []).append((i, s))
    return by_len


def check_chunk_proof(
    proof: bytes, chunk: torch.Tensor, thresholds: Thresholds = Thresholds()
) -> ChunkCheck:
    m, coef = decode(proof)
    return _check_same_shape([m], coef[None], chunk[None], thresholds)[0]


def _check_same_shape(
    moduli: list[int], coef: np.ndarray, chunks: torch.Tensor, thresholds: Thresholds
) -> list[ChunkCheck]:
    """Check n proofs with k coefficients each against n chunks of equal shape."""
    idx, own = _topk(chunks, coef.shape[1])
    if idx.shape[1] != coef.shape[1]:
        return [ChunkCheck(coef.shape[1], float("inf"), float("inf"), False)] * len(chunks)
    claimed = evaluate(coef, idx % np.asarray(moduli, dtype=np.int64)[:, None])
    same_exp = ((claimed & 0x7F80) >> 7) == ((own & 0x7F80) >> 7)
    err = np.abs((claimed & 0x7F) - (own & 0x7F))
    out = []
    for row in range(len(chunks)):
        mismatches = int((~same_exp[row]).sum())
        if not same_exp[row].any():
            out.append(ChunkCheck(mismatches, float("inf"), float("inf"), False))
            continue
        e = err[row][same_exp[row]]
        mean, median = float(e.mean()), float(np.median(e))
        ok = (
            mismatches <= thresholds.max_exp_mismatches
            and mean <= thresholds.max_mantissa_mean
            and median <= thresholds.max_mantissa_median
        )
        out.append(ChunkCheck(mismatches, mean, median, ok))
    return out


def chunk_sizes(n_tokens: int, hidden: int, k: int = TOPK) -> list[int]:
    """Byte size of each chunk proof of a sample: n_tokens generated, hidden size H."""
    return [
        2 + 2 * min(k, min(CHUNK, n_tokens - start) * hidden) for start in range(0, n_tokens, CHUNK)
    ]


def build_proofs(hidden: torch.Tensor, k: int = TOPK) -> bytes:
    """All chunk proofs of one sample: `hidden` is (n_generated, H)."""
    return build_proofs_many([hidden], k)[0]


def build_proofs_many(samples: list[torch.Tensor], k: int = TOPK) -> list[bytes]:
    """Proofs of many samples at once: chunks of equal length are proved together."""
    parts: dict[tuple[int, int], bytes] = {}
    for length, members in _chunks(samples).items():
        stacked = torch.stack([samples[i][s : s + length] for i, s in members])
        parts.update(zip(members, _build_same_shape(stacked, k), strict=True))
    return [b"".join(parts[(i, s)] for s in range(0, len(h), CHUNK)) for i, h in enumerate(samples)]


def check_proofs(
    proofs: bytes, hidden: torch.Tensor, k: int = TOPK, thresholds: Thresholds = Thresholds()
) -> list[ChunkCheck]:
    """Check a sample's proofs against the verifier's own hidden states."""
    return check_proofs_many([proofs], [hidden], k, thresholds)[0]


def split_proofs(proofs: bytes, n_tokens: int, hidden: int, k: int = TOPK) -> list[bytes]:
    """A sample's concatenated proofs cut into chunk proofs; ValueError on a wrong length."""
    sizes = chunk_sizes(n_tokens, hidden, k)
    if len(proofs) != sum(sizes):
        raise ValueError(f"proofs are {len(proofs)} bytes, expected {sum(sizes)}")
    offsets = np.cumsum([0] + sizes)
    return [proofs[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def check_proofs_many(
    proofs: list[bytes],
    samples: list[torch.Tensor],
    k: int = TOPK,
    thresholds: Thresholds = Thresholds(),
) -> list[list[ChunkCheck]]:
    """Check many samples' proofs at once (chunks of equal length together).
    Raises ValueError when a sample's proofs have the wrong length."""
    pieces = [split_proofs(p, len(h), h.shape[-1], k) for p, h in zip(proofs, samples, strict=True)]
    results: dict[tuple[int, int], ChunkCheck] = {}
    for length, members in _chunks(samples).items():
        decoded = [decode(pieces[i][s // CHUNK]) for i, s in members]
        stacked = torch.stack([samples[i][s : s + length] for i, s in members])
        checks = _check_same_shape(
            [m for m, _ in decoded], np.stack([c for _, c in decoded]), stacked, thresholds
        )
        results.update(zip(members, checks, strict=True))
    return [[results[(i, s)] for s in range(0, len(h), CHUNK)] for i, h in enumerate(samples)]


def to_base64(proof: bytes) -> str:
    return base64.b64encode(proof).decode()
