"""FSDP2 over two gloo ranks gives the one-rank GRPO update."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swarmrl.launch.supervisor import free_port
from swarmrl.trainer.step import grpo_update
from tests.unit.fsdp_case import case

HERE = Path(__file__).resolve().parent


def _two_ranks(out: Path, forward: str, *extra: str) -> dict:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "fsdp_ranks.py"), str(out), forward, *extra],
            env={
                **os.environ,
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "OMP_NUM_THREADS": "1",
            },
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in range(2)
    ]
    errs = [p.communicate(timeout=180)[1] for p in procs]
    if any(p.returncode for p in procs):  # both ranks' stderr: either may be the cause
        shown = [
            f"--- rank {r} (exit {p.returncode}):\n{err[-2500:]}"
            for r, (p, err) in enumerate(zip(procs, errs, strict=True))
        ]
        raise AssertionError("\n".join(shown))
    return torch.load(out)


@pytest.mark.parametrize("forward", ["shared", "packed"])
def test_two_gloo_ranks_match_one_rank(tmp_path, forward):
    two = _two_ranks(tmp_path / "rank0.pt", forward)

    model, samples, cfg, budget = case(share=forward == "shared")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    one = grpo_update(model, None, opt, samples, cfg, budget, 0)

    s1, s2 = one.__dict__, two["stats"]
    assert s2["tokens"] == s1["tokens"]
    assert s2["mismatch"]["tokens"] == one.mismatch.tokens  # per sample, summed over ranks
    for k in ("loss", "grad_norm", "entropy", "clip_fraction"):
        assert abs(s2[k] - s1[k]) <= 1e-5 * max(1.0, abs(s1[k])), (k, s1[k], s2[k])
    mine = model.state_dict()
    assert set(two["weights"]) <= set(mine)
    # Two AdamW steps of lr 1e-3: the ranks add gradients in another order, and Adam's
    # division by sqrt(v) enlarges float differences where a gradient is near zero;
    # 5e-5 is 5% of one step (measured here: 8.6e-6).
    for name, w in two["weights"].items():
        assert torch.allclose(w, mine[name], atol=5e-5, rtol=0), name
    # the update moved the weights (the comparison is not between two untouched copies)
    start, _, _, _ = case()
    assert any(not torch.equal(w, start.state_dict()[n]) for n, w in two["weights"].items())


def test_checkpoint_from_two_ranks_resumes_on_one(tmp_path):
    """A DCP checkpoint written by 2 FSDP2 ranks loads into one unsharded process, model
    and AdamW state both: the next update there matches the 2-rank run's next update."""
    from swarmrl.trainer.fsdp import load_checkpoint

    two = _two_ranks(tmp_path / "rank0.pt", "shared", str(tmp_path / "ckpt"))
    model, samples, cfg, budget = case()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    load_checkpoint(model, opt, tmp_path / "ckpt")
    for name, w in model.state_dict().items():
        assert torch.equal(w, two["weights"][name]), name  # the saved weights, exactly
    grpo_update(model, None, opt, samples[::-1], cfg, budget, 0)
    for name, w in model.state_dict().items():  # fresh AdamW state would step differently
        assert torch.allclose(w, two["after_second"][name], atol=5e-5, rtol=0), name

    # The trainer's checkpoint: the optimizer alone (DCP, written by both ranks), the
    # weights from the published version (here: the gathered state dict).
    from swarmrl.trainer.ranks import load_optimizer

    model, samples, cfg, budget = case()
    model.load_state_dict(two["weights"], strict=False)  # tied lm_head: published once
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    load_optimizer(model, opt, tmp_path / "ckpt" / "optim")
    grpo_update(model, None, opt, samples[::-1], cfg, budget, 0)
    for name, w in model.state_dict().items():
        assert torch.allclose(w, two["after_second"][name], atol=5e-5, rtol=0), name
