"""8-bit block quantization of pseudo-gradients.

Each block of `block` consecutive values is stored as uint8 codes with one fp32
scale: scale = max|x| / 127, code = round(x / scale) + 127, so codes span
0..254, 127 is exactly zero, and an all-zero block stays exactly zero (a site
with nothing to contribute sends zeros that add nothing). Per-block scales were
chosen over INTELLECT-1's 256-entry table of bucket means: one pass, no sort,
and an outlier only coarsens its own block. The cost is 4 bytes of scale per
block (1.6% at the default 256). Rounding is to nearest (ties to even), so
quantizing the same tensor gives the same bytes on every machine.
"""

from __future__ import annotations

import torch

ZERO_CODE = 127
MAX_CODE = 254


def padded_length(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (uint8, x.numel()) and scales (fp32, one per block) of a flat fp32
    tensor whose length is a multiple of `block`."""
    if x.dim() != 1 or x.numel() % block:
        raise ValueError(f"quantize needs a flat tensor of a multiple of {block} values")
    blocks = x.float().view(-1, block)
    scales = blocks.abs().amax(dim=1) / ZERO_CODE
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(blocks / safe[:, None]).clamp_(-ZERO_CODE, ZERO_CODE) + ZERO_CODE
    return codes.to(torch.uint8).view(-1), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """The fp32 values that `codes` and `scales` stand for."""
    values = codes.view(-1, block).float() - ZERO_CODE
    return (values * scales[:, None]).view(-1)
