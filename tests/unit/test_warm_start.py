"""The warm start stops on a measurement: the band is reached, and a sharp rise cannot jump it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from swarmrl.apps import warm_start as ws
from swarmrl.config import SamplingConfig, TaskConfig
from swarmrl.inference.hf import HFBackend
from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def _distance_from(model, start: dict[str, torch.Tensor]) -> float:
    return sum(float((p - start[k]).norm()) for k, p in model.state_dict().items())


def test_a_sharp_transition_is_caught_inside_the_band(monkeypatch):
    """A measurement that jumps from 0.05 to 0.95 over a short stretch of weight-space
    distance (far sharper than the real curve): the first checks overshoot, the warm
    start backs off with smaller steps, and it still ends inside the band."""
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden=32, layers=1, seed=3)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    checks = []

    def sharp(backend, *args, **kwargs):
        d = _distance_from(backend.model, start)
        r = 0.05 + 0.9 * float(torch.sigmoid(torch.tensor((d - 1.2) / 0.02)))
        checks.append((d, r))
        return r

    monkeypatch.setattr(ws, "sampled_reward", sharp)
    band = ws.Band(0.30, 0.05)
    res = ws.warm_start(
        model, tok, TaskConfig(), SamplingConfig(max_new_tokens=8), band,
        max_steps=400, batch=8, lr=2e-3, check_every=4, coarse_every=4, max_restarts=12,
    )  # fmt: skip
    assert res.restarts >= 1, "the fake transition should have been overshot at least once"
    assert res.in_band and band.center <= res.sampled_reward <= band.hi, res
    # the model kept is the one measured: measuring it again gives the recorded reward
    assert abs(sharp(HFBackend.around(model)) - res.sampled_reward) < 1e-3
    assert any(h["lr"] < 2e-3 for h in res.history)


def test_the_real_measurement_is_the_sampled_reward_at_the_run_temperature():
    """sampled_reward is deterministic for fixed weights and seeds, and it moves with
    the temperature (a random model: near 0 reward, but not the same number)."""
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden=32, layers=1, seed=3).eval()
    backend = HFBackend.around(model)
    task = TaskConfig()
    a = ws.sampled_reward(backend, tok, task, SamplingConfig(max_new_tokens=8), 8, 2, seed=0)
    b = ws.sampled_reward(backend, tok, task, SamplingConfig(max_new_tokens=8), 8, 2, seed=0)
    cold = SamplingConfig(max_new_tokens=8, temperature=0.1)
    c = ws.sampled_reward(backend, tok, task, cold, 8, 2, seed=0)
    assert a == b and 0.0 <= a <= 1.0 and c != a


@pytest.mark.slow
@pytest.mark.parametrize("threads,seed", [(1, 0), (2, 0), (1, 1), (2, 1)])
def test_the_real_warm_start_lands_in_the_band(tmp_path, threads, seed):
    """The default run's warm start, as `make run` builds it, with 1 and 2 threads and two
    seeds: the sampled reward it records is inside the band, and measuring the saved
    model again gives the same number (a few minutes each)."""
    from swarmrl.apps.init_model import init_model
    from swarmrl.config import load_config
    from swarmrl.inference.hf import HFBackend
    from swarmrl.models.loading import load_tokenizer

    cfg = load_config(ROOT / "configs" / "tiny.toml")
    band = ws.Band()
    res = init_model(cfg.task, cfg.sampling, tmp_path / "m", band=band, seed=seed, threads=threads)
    assert res.in_band and band.lo <= res.sampled_reward <= band.hi, res
    recorded = json.loads((tmp_path / "m" / "warm_start.json").read_text())
    assert recorded["sampled_reward"] == res.sampled_reward and recorded["threads"] == threads
    backend = HFBackend()
    backend.load(tmp_path / "m")
    again = ws.sampled_reward(
        backend, load_tokenizer(str(tmp_path / "m")), cfg.task, cfg.sampling,
        res.check["problems"], res.check["samples"], seed,
    )  # fmt: skip
    assert abs(again - res.sampled_reward) < 0.02, (again, res.sampled_reward)
