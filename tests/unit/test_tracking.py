"""The trackers: TensorBoard event files read back with TensorBoard's own reader, and a
W&B offline run directory whose records are read back (W&B's transaction log: LevelDB's
log format of protobuf records), with the figures and names the run recorded."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from swarmrl.config import load_config
from swarmrl.errors import ConfigError
from swarmrl.tracking import Tracker, heldout_scalars, node_scalars, scalars

BLOCK = 32768  # LevelDB log blocks


def _records(path: Path):
    """The payloads of a .wandb file: a 7-byte header (':W&B', magic, version), then
    LevelDB log records (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, part = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            part = chunk
        elif kind == 3:
            part += chunk
        elif kind == 4:
            yield part + chunk


def wandb_history(wandb_dir: Path) -> list[dict]:
    """Every history row of every offline run under `wandb_dir` (values as W&B's JSON)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    files = sorted(wandb_dir.glob("offline-run-*/run-*.wandb"))
    assert files, f"no offline run under {wandb_dir}"
    for f in files:
        for payload in _records(f):
            r = pb.Record()
            r.ParseFromString(payload)
            if r.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): i.value_json for i in r.history.item})
    return rows


def test_figures_are_the_rows_numbers_under_their_names():
    row = {"step": 3, "reward": 0.5, "synced": True, "loss": None, "note": "x",
           "nan": float("nan")}  # fmt: skip
    assert scalars(row) == {"step": 3.0, "reward": 0.5, "synced": 1.0}
    ledger = {"nodes": [
        {"key": "ab" * 32, "role": "worker", "accepted": 4, "rejected": 1, "pending": 0,
         "stake": 100.0, "slashed": 0.0, "kl_unchecked": None, "kl_checked": 0.002},
        {"key": "cd" * 32, "role": "relay", "accepted": 0},
    ]}  # fmt: skip
    got = node_scalars(ledger)
    assert got["node/abababababab/accepted"] == 4.0
    assert got["node/abababababab/kl_checked"] == 0.002
    assert "node/abababababab/kl_unchecked" not in got and not any("cdcd" in k for k in got)
    assert heldout_scalars({"start_model": {"accuracy": 0.25, "mode": "greedy"}}) == {
        "heldout/start_model/accuracy": 0.25
    }


def test_tensorboard_and_wandb_offline_hold_what_was_logged(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(None, [f'runs_dir="{tmp_path}"', "name=t", 'tracking.wandb="offline"'])
    rows = [{"step": s, "reward": 0.1 * s, "loss": 1.0 / s} for s in (1, 2, 3)]
    tracker = Tracker(cfg, "trainer")
    tracker.config()
    for r in rows:
        tracker.log(scalars(r), r["step"])
    tracker.close()
    later = Tracker(cfg, "launcher")  # the launcher's held-out score, into the same run
    later.log({"heldout/final_model/accuracy": 0.75}, 3)
    later.close()
    acc = EventAccumulator(str(cfg.paths.tensorboard))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [
        (r["step"], pytest.approx(r["reward"])) for r in rows
    ]
    assert [e.value for e in acc.Scalars("heldout/final_model/accuracy")] == [0.75]
    assert "config/text_summary" in acc.Tags()["tensors"]  # the resolved config, as text
    history = wandb_history(cfg.paths.wandb)
    logged = {int(h["_step"]): float(h["reward"]) for h in history if "reward" in h}
    assert logged == {r["step"]: pytest.approx(r["reward"]) for r in rows}
    assert any(h.get("heldout/final_model/accuracy") == "0.75" for h in history)
    # both processes wrote under the run's one W&B id (run-<id>.wandb in each directory)
    runs = list((cfg.paths.wandb).glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and len({f.name for f in runs}) == 1, runs


def test_a_tracker_that_cannot_start_says_which_setting(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_wandb(name, *a, **k):
        if name == "wandb":
            raise ImportError("no module named wandb")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    cfg = load_config(None, [f'runs_dir="{tmp_path}"', "name=t", 'tracking.wandb="offline"',
                             "tracking.tensorboard=false"])  # fmt: skip
    with pytest.raises(ConfigError, match="tracking.wandb"):
        Tracker(cfg, "trainer")
