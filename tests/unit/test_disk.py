"""The launcher's room-on-disk check (launch/disk.py)."""

from __future__ import annotations

import shutil
from collections import namedtuple

import pytest
import torch

from swarmrl.config import load_config
from swarmrl.launch import disk
from swarmrl.launch.swarm import LaunchError

Usage = namedtuple("Usage", "total used free")


def test_the_need_counts_every_copy_and_the_trainer_state():
    cfg = load_config(None, ["async_level=2", "shardcast.keep_local=2"])
    need = disk.disk_need(cfg, elements=1000, relays=1, validators=1, workers=2)
    assert need.version_bytes == 4000  # float32
    # trainer: weights/ (3) and final/; a relay 3, a validator 4, each worker 2
    assert need.versions == (3 + 1) + 3 + 4 + 2 * 2
    assert need.state_bytes == 3 * 1000 * 4 * 2  # 3 states of AdamW's two moments
    bf16 = disk.disk_need(load_config(None, ["model.publish_dtype=bfloat16"]), 1000, 1, 1, 2)
    assert bf16.version_bytes == 2000
    assert bf16.state_bytes == 3 * (1000 * 4 * 2 + 1000 * 4)  # and the float32 masters
    assert need.total == int((need.version_bytes * need.versions + need.state_bytes) * 1.2)
    # a trainer on CUDA publishes bfloat16 ("auto") and keeps float32 masters
    cuda = disk.disk_need(cfg, 1000, 1, 1, 2, published_dtype=torch.bfloat16)
    assert cuda.version_bytes == 2000 and cuda.state_bytes == bf16.state_bytes
    # without SHARDCAST the other processes read the trainer's versions: no copies
    local = load_config(None, ["shardcast.enabled=false"])
    assert disk.disk_need(local, 1000, 1, 1, 2).versions == 3 + 1
    # adapter versions: one whole version (0) per holder, and each node's two merged
    # copies; no whole-model optimizer state
    lora = disk.disk_need(load_config(None, ["trainer.lora.rank=4"]), 1000, 3, 2, 9)
    assert lora.versions == 2 + 3 + (2 + 9) * 3 and lora.state_bytes == 0
    local_lora = load_config(None, ["trainer.lora.rank=4", "shardcast.enabled=false"])
    assert disk.disk_need(local_lora, 1000, 3, 2, 9).versions == 2 + (2 + 9) * 2


def test_a_swarm_without_room_is_refused_with_the_figures(tmp_path, monkeypatch):
    cfg = load_config(None, [f"runs_dir={str(tmp_path / 'not' / 'yet')!r}"])
    monkeypatch.setattr(disk, "model_elements", lambda path: 500_000_000)
    need = disk.disk_need(cfg, 500_000_000, 1, 1, 2)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, 0, need.total - 1))
    with pytest.raises(LaunchError, match=r"not enough disk .* GiB free .* about .* GiB needed"):
        disk.check_disk(cfg, 1, 1, 2)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, 0, need.total))
    assert disk.check_disk(cfg, 1, 1, 2) == need
    # resuming: the run's own files count as room, since the run needs them anyway
    run = tmp_path / "not" / "yet" / cfg.name
    (run / "weights" / "step_000001").mkdir(parents=True)
    (run / "weights" / "step_000001" / "model.safetensors").write_bytes(b"x" * 1000)
    (run / "metrics.jsonl").write_bytes(b"x" * 5000)  # not a version: no room
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, 0, need.total - 1000))
    assert disk.check_disk(cfg, 1, 1, 2) == need
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(1 << 40, 0, need.total - 1001))
    with pytest.raises(LaunchError, match="this run's files included"):
        disk.check_disk(cfg, 1, 1, 2)
