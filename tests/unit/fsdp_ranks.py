"""One rank of the FSDP2 test (run as a script by test_fsdp.py).

usage: fsdp_ranks.py OUT_FILE shared|packed [CHECKPOINT_DIR]    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

Builds the test policy and batch (tests/unit/fsdp_case.py), shards it with
FSDP2, runs this rank's share of one GRPO update and writes the stats and the
gathered weights (rank 0).
"""

from __future__ import annotations

import dataclasses
import faulthandler
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from swarmrl.device import resolve_device  # noqa: E402
from swarmrl.trainer.fsdp import (  # noqa: E402
    exit_after_leaving,
    full_state_dict,
    init_distributed,
    leave_distributed,
    save_checkpoint,
    shard,
)
from swarmrl.trainer.ranks import save_optimizer  # noqa: E402
from swarmrl.trainer.step import grpo_update  # noqa: E402
from tests.unit.fsdp_case import case  # noqa: E402


def main() -> None:
    faulthandler.enable()  # a rank that aborts shows every thread's stack
    torch.set_num_threads(1)
    device = resolve_device("cpu", "trainer.device")
    rank, world = init_distributed(device)
    model, samples, cfg, budget = case(share=sys.argv[2] == "shared")
    shard(model, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stats = grpo_update(model, None, opt, samples, cfg, budget, 0, rank, world)
    weights = full_state_dict(model)
    if len(sys.argv) > 3:  # checkpoint after this update, then take one more
        save_checkpoint(model, opt, sys.argv[3])
        save_optimizer(model, opt, Path(sys.argv[3]) / "optim")  # the trainer's kind
        grpo_update(model, None, opt, samples[::-1], cfg, budget, 0, rank, world)
        after = full_state_dict(model)
    if rank == 0:
        out = {"stats": dataclasses.asdict(stats), "weights": weights}
        if len(sys.argv) > 3:
            out["after_second"] = after
        torch.save(out, sys.argv[1])
    leave_distributed()
    exit_after_leaving()


if __name__ == "__main__":
    main()
