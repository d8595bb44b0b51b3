"""Devices: the setting resolved in one place (swarmrl/device.py), and the trainer's
step making every tensor on the model's device.

The step test runs whole updates with torch's default device set to `meta`: a
tensor made without naming its device lands there, and fails as soon as it meets
the model's (CPU) tensors, as a CPU tensor meets a GPU model's. The update is the
one the trainer runs on any device (`grpo_update`), with the fused AdamW the
trainer builds."""

from __future__ import annotations

import random

import pytest
import torch

from swarmrl.config import ConfigError, TrainerConfig, load_config
from swarmrl.device import describe, resolve_device
from swarmrl.trainer.batch import Sample
from swarmrl.trainer.ranks import adamw
from swarmrl.trainer.step import grpo_update


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


def _samples(seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(3):
        prompt = [rng.randrange(3, 80) for _ in range(rng.randint(4, 9))]
        for _ in range(4):
            comp = [rng.randrange(3, 80) for _ in range(rng.randint(1, 9))]
            behav = [-rng.uniform(0.5, 5.0) for _ in comp]
            out.append(Sample(prompt, comp, rng.uniform(-1, 1), 0.0, 0.0, 0.0, 0,
                              behav_logprobs=behav, temperature=1.0))  # fmt: skip
    return out


@pytest.mark.parametrize("share", [True, False], ids=["shared prompts", "packed"])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_every_tensor_of_a_step_is_made_on_the_models_device(share, top_p):
    model = _model()
    cfg = TrainerConfig(micro_batch=5, optimizer_steps=2, share_prompts=share, kl_coef=0.0)
    opt = adamw(list(model.parameters()), cfg)
    grpo_update(model, None, opt, _samples(0), cfg, 200.0, 0, top_p=top_p)  # optimizer state
    before = [p.detach().clone() for p in model.parameters()]
    torch.set_default_device("meta")
    try:
        stats = grpo_update(model, None, opt, _samples(1), cfg, 200.0, 0, top_p=top_p)
    finally:
        torch.set_default_device(None)
    assert stats.tokens > 0 and torch.isfinite(torch.tensor(stats.loss))
    changed = [not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)]
    assert any(changed) and all(p.device.type == "cpu" for p in model.parameters())


def test_the_check_sees_a_tensor_made_off_the_device(monkeypatch):
    """The meta check above is not vacuous: with a batch built on the default device (as
    a CPU-only `_pack` would), the same update fails under it."""
    from swarmrl.trainer import step

    packed = step._pack

    def default_device_pack(samples, pad_id, device):
        return tuple(torch.tensor(t.tolist()) for t in packed(samples, pad_id, "cpu"))

    model = _model()
    cfg = TrainerConfig(micro_batch=5, optimizer_steps=1, kl_coef=0.0)
    opt = adamw(list(model.parameters()), cfg)
    monkeypatch.setattr(step, "_pack", default_device_pack)
    torch.set_default_device("meta")
    try:
        with pytest.raises((RuntimeError, NotImplementedError)):
            grpo_update(model, None, opt, _samples(1), cfg, 200.0, 0)
    finally:
        torch.set_default_device(None)


def test_settings_resolve_or_name_what_is_wrong(monkeypatch):
    assert resolve_device("cpu", "trainer.device") == torch.device("cpu")
    assert describe(torch.device("cpu")).startswith("cpu (")
    if torch.cuda.is_available():
        pytest.skip("the CUDA errors are for machines without CUDA")
    assert resolve_device("auto", "trainer.device") == torch.device("cpu")
    for setting in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match=r"validator\.device = .*no CUDA device"):
            resolve_device(setting, "validator.device")
    with pytest.raises(ConfigError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device("gpu", "trainer.device")


@pytest.mark.parametrize("key", ["trainer.device", "validator.device", "worker.device"])
def test_a_bad_device_setting_is_a_config_error(key):
    assert load_config(None, [f'{key}="cuda:0"'])  # valid whether or not CUDA is here
    with pytest.raises(ConfigError, match=key.split(".")[1]):
        load_config(None, [f'{key}="tpu"'])


def test_status_shows_where_the_trainer_validators_and_workers_compute(orch):
    """The trainer says its device with each step, a validator with each claim, a worker
    in its hardware report; the public ledger and `swarmrl status` show them."""
    from swarmrl.protocol.status import ledger_table
    from tests.unit.orch_util import HW, pubhex

    o = orch()
    o.ok(o.trainer, "POST", "/v1/trainer/step", {"step": 0, "device": "cuda:0 (NVIDIA H200)"})
    o.ok(o.validator, "POST", "/v1/validation/claim", {"device": "cpu (2 threads)"})
    o.ok(o.validator, "POST", "/v1/validation/claim", {"device": "cpu (2 threads)"})  # no write
    w = o.worker("w")
    o.register(w, {**HW, "device": "cuda:1 (NVIDIA H100 80GB HBM3)"})
    ledger = o.http.get("/v1/ledger").json()
    assert ledger["devices"] == {
        "trainer": "cuda:0 (NVIDIA H200)",
        "validators": {pubhex(o.validator): "cpu (2 threads)"},
    }
    assert ledger["nodes"][0]["device"] == "cuda:1 (NVIDIA H100 80GB HBM3)"
    table = ledger_table(ledger, now=o.clock())
    assert "trainer on cuda:0 (NVIDIA H200)" in table
    assert f"validator {pubhex(o.validator)[:16]} on cpu (2 threads)" in table
    assert "cuda:1 (NVIDIA H100 80GB HBM3)" in table.splitlines()[-1]
    r = o.call(o.trainer, "POST", "/v1/trainer/step", {"step": 1, "device": "x" * 201})
    assert r.status_code == 422  # bounded like every other field
