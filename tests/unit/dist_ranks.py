"""One rank of the 8-bit all-reduce test (run as a script by test_diloco_allreduce.py).

usage: dist_ranks.py RANK WORLD PORT OUT_DIR

All ranks join one gloo group on loopback; groups of the first 2, 3 and 4 ranks
all-reduce tensors of odd sizes with allreduce_int8 and with fp32 all_reduce,
through bench/diloco.py's wrapper that records what each collective is handed to send. Each
rank writes its results to OUT_DIR/rank{R}.pt for the test to compare.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.diloco import CountingLink  # noqa: E402
from swarmrl.diloco.allreduce import allreduce_fp32, allreduce_int8  # noqa: E402
from swarmrl.trainer.fsdp import exit_after_leaving, leave_distributed  # noqa: E402

SIZES = [1, 7, 255, 257, 4099, 70001]


def main() -> None:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    results = {}
    for w in (2, 3, 4):
        if w > world:
            break
        group = dist.new_group(list(range(w)), backend="gloo")
        if rank >= w:
            continue
        for n in SIZES:
            g = torch.Generator().manual_seed(1000 * w + 10 * n + rank)
            x = torch.randn(n, generator=g) * (1 + rank)  # ranks differ in scale
            counting = CountingLink(group, w)
            q = allreduce_int8(counting, x, w, divisor=w, block=256)
            exact = allreduce_fp32(group, x, divisor=w)
            results[(w, n)] = {"x": x, "q": q, "exact": exact, "sent": counting.log}
    torch.save(results, f"{out}/rank{rank}.pt")
    leave_distributed()
    exit_after_leaving()


if __name__ == "__main__":
    main()
