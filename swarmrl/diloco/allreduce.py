"""All-reduce of pseudo-gradients with 8-bit payloads, over any c10d process group.

torchft's own quantized collectives are Triton kernels; on CPU its
`should_quantize=True` sends full precision. This one runs on the process group
the engine manages (torchft's reconfigurable gloo group, or a plain
torch.distributed group) with two standard collectives:

1. the flat tensor is split into one chunk per rank and quantized
   (quant.py: uint8 codes + an fp32 scale per block); `alltoall_base` sends
   chunk j of every rank to rank j;
2. rank j dequantizes the chunks it received and adds them in fp32 in rank
   order, divides by `divisor`, quantizes the result and `allgather`s it;
3. every rank, the owner included, dequantizes the same gathered bytes, so the
   result is bit-identical everywhere.

Each rank sends about 2·(W−1)/W bytes per value (fp32 ring all-reduce: 8·(W−1)/W),
plus 4 bytes of scale per block. The error is bounded: each quantization moves
a value by at most half a step, max|block| / 254.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    ReduceOp,
)

from swarmrl.diloco.quant import dequantize, padded_length, quantize


@dataclass(frozen=True)
class Layout:
    """How a tensor of `numel` values is cut into `world` chunks of whole blocks."""

    numel: int
    world: int
    block: int

    @property
    def chunk(self) -> int:
        return padded_length(-(-self.numel // self.world), self.block)

    @property
    def segment_bytes(self) -> int:
        """One chunk on the wire: its codes, then its scales as bytes."""
        return self.chunk + 4 * (self.chunk // self.block)

    def pack(self, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """uint8 [k, segment_bytes] for k chunks' codes and scales."""
        k = codes.numel() // self.chunk
        return torch.cat(
            [codes.view(k, self.chunk), scales.view(k, -1).contiguous().view(torch.uint8)], dim=1
        )

    def unpack(self, segment: torch.Tensor) -> torch.Tensor:
        codes = segment[: self.chunk]
        scales = segment[self.chunk :].contiguous().view(torch.float32)
        return dequantize(codes, scales, self.block)


def _wait(work) -> None:
    if work.wait() is False:  # torchft's wrapped work answers False on a timeout
        raise RuntimeError("collective timed out")


def allreduce_int8(
    pg, flat: torch.Tensor, world: int, divisor: float, block: int = 256
) -> torch.Tensor:
    """Sum of `flat` over the `world` ranks of `pg`, divided by `divisor`, sent as
    8-bit codes; the same fp32 tensor on every rank. Raises if a peer fails."""
    if flat.dim() != 1:
        raise ValueError("allreduce_int8 takes a flat tensor")
    if world == 1:
        return flat.float() / divisor
    lay = Layout(flat.numel(), world, block)
    padded = torch.zeros(lay.chunk * world, dtype=torch.float32)
    padded[: flat.numel()] = flat
    send = lay.pack(*quantize(padded, block))
    recv = torch.empty_like(send)
    splits = [lay.segment_bytes] * world
    _wait(pg.alltoall_base(recv.view(-1), send.view(-1), splits, splits, AllToAllOptions()))
    total = torch.zeros(lay.chunk, dtype=torch.float32)
    for i in range(world):  # fixed order: the owner's sum does not depend on arrival
        total += lay.unpack(recv[i])
    total /= divisor
    mine = lay.pack(*quantize(total, block))[0]
    gathered = [torch.empty_like(mine) for _ in range(world)]
    _wait(pg.allgather([gathered], [mine], AllgatherOptions()))
    return torch.cat([lay.unpack(g) for g in gathered])[: flat.numel()]


def allreduce_fp32(pg, flat: torch.Tensor, divisor: float) -> torch.Tensor:
    """The full-precision path (`diloco.bits = 32`): a sum all-reduce, divided."""
    out = flat.float().clone()
    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    _wait(pg.allreduce([out], opts))
    return out / divisor


def wire_bytes_int8(numel: int, world: int, block: int = 256) -> int:
    """Bytes one rank hands the transport to send in `allreduce_int8` (the
    alltoall's segments for the other ranks, and its gathered segment to each)."""
    if world == 1:
        return 0
    return 2 * (world - 1) * Layout(numel, world, block).segment_bytes
