"""Master weights and published weights: the trainer keeps float32 masters and
publishes each version in `model.publish_dtype`; engines run each version in the
dtype its files hold; --resume restores the masters, not their rounded copy."""

from __future__ import annotations

import json
import random

import pytest
import torch

from swarmrl.config import load_config
from swarmrl.inference.hf import HFBackend
from swarmrl.models.loading import ModelLoadError, set_config_dtype, stored_dtype
from swarmrl.trainer.batch import Sample
from swarmrl.trainer.ranks import Policy, publish_dtype


def _cfg(tmp_path, model_dir, *overrides):
    return load_config(
        None,
        [
            f"runs_dir={json.dumps(str(tmp_path / 'runs'))}",
            f"model.path={json.dumps(str(model_dir))}",
            "worker.group_size=2",
            "trainer.batch_groups=2",
            "trainer.kl_coef=0.0",
            *overrides,
        ],
    )


def _publish(policy: Policy, snapshot: dict, d):
    policy.model.save_pretrained(d, state_dict=snapshot, safe_serialization=True)
    floating = next(v.dtype for v in snapshot.values() if v.is_floating_point())
    set_config_dtype(d, str(floating).removeprefix("torch."))


def test_auto_is_bfloat16_on_cuda_and_the_master_dtype_on_cpu(tmp_path, tiny_dir):
    cfg = _cfg(tmp_path, tiny_dir)
    assert publish_dtype(cfg, torch.device("cpu")) == torch.float32
    assert publish_dtype(cfg, torch.device("cuda", 0)) == torch.bfloat16
    bf = _cfg(tmp_path, tiny_dir, "model.publish_dtype=bfloat16")
    assert publish_dtype(bf, torch.device("cpu")) == torch.bfloat16


def test_bfloat16_versions_from_float32_masters_and_resume_keeps_the_masters(tmp_path, tiny_dir):
    cfg = _cfg(tmp_path, tiny_dir, "model.publish_dtype=bfloat16")
    policy = Policy(cfg, 0, 1)
    first = policy.start(str(tiny_dir))
    assert all(v.dtype == torch.bfloat16 for v in first.values() if v.is_floating_point())
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    rng = random.Random(0)
    samples = [
        Sample([rng.randrange(4, 90) for _ in range(6)], [rng.randrange(4, 90) for _ in range(5)],
               rng.uniform(-1, 1), 0.0, 0.0, 0.0, 0)
        for _ in range(4)
    ]  # fmt: skip
    policy.step(1, samples)
    snap = policy.snapshot()
    masters = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    for k, v in snap.items():  # the version is the masters rounded to nearest bfloat16
        assert v.dtype == torch.bfloat16 and torch.equal(v, masters[k].to(torch.bfloat16))
    assert any(not torch.equal(v.float(), masters[k]) for k, v in snap.items())
    version = tmp_path / "step_000001"
    _publish(policy, snap, version)
    assert stored_dtype(version) == "bfloat16"
    assert json.loads((version / "config.json").read_text())["dtype"] == "bfloat16"
    optim = policy.save(cfg.paths, 1)

    again = Policy(cfg, 0, 1)
    again.start(str(version), str(optim))  # --resume: the version, then the checkpoint
    for k, v in again.model.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, masters[k]), k


def test_float32_versions_need_no_masters_in_the_checkpoint(tmp_path, tiny_dir):
    import torch.distributed.checkpoint as dcp

    cfg = _cfg(tmp_path, tiny_dir)
    policy = Policy(cfg, 0, 1)
    policy.start(str(tiny_dir))
    assert not policy.publish_rounds()
    optim = policy.save(cfg.paths, 0)
    keys = dcp.FileSystemReader(str(optim)).read_metadata().state_dict_metadata
    assert not any(k.startswith("model.") for k in keys)


def test_engines_run_each_version_in_the_dtype_its_files_hold(tmp_path, tiny_dir):
    from swarmrl.models.loading import load_model

    half = tmp_path / "bf16"
    model = load_model(str(tiny_dir)).to(torch.bfloat16)
    model.save_pretrained(half)
    set_config_dtype(half, "bfloat16")
    assert stored_dtype(tiny_dir) == "float32" and stored_dtype(half) == "bfloat16"
    engine = HFBackend()
    engine.load(tiny_dir)
    assert engine.running_dtype == "float32"
    engine.load(half)  # another dtype: loaded anew, not cast into the float32 model
    assert engine.running_dtype == "bfloat16"
    out = engine.generate([[5, 6, 7]], [3], 4, 1.0, 1.0)
    assert len(out[0].tokens) >= 1
    engine.load(half)  # the same dtype: swapped in place
    assert engine.running_dtype == "bfloat16"
    forced = HFBackend(dtype="float32")
    forced.load(half)
    assert forced.running_dtype == "float32"


def test_a_corrupt_safetensors_header_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(ModelLoadError, match="unreadable safetensors header"):
        stored_dtype(tmp_path)
    assert stored_dtype(tmp_path / "nothing-here") is None


def test_a_bfloat16_engine_takes_its_logits_in_float32_and_follows_swaps(tmp_path, tiny_dir):
    """The LM head of a bfloat16 policy runs in float32 (bfloat16 logits are 0.125 apart
    at the magnitudes logits reach), and a hot swap's new weights are used at once."""
    from swarmrl.models.loading import load_model

    half, other = tmp_path / "bf16", tmp_path / "other"
    model = load_model(str(tiny_dir)).to(torch.bfloat16)
    model.save_pretrained(half)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    model.save_pretrained(other)
    engine = HFBackend()
    engine.load(half)
    m = engine.model
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        hidden = m.model(input_ids=ids).last_hidden_state
        logits = m(input_ids=ids).logits
        want = torch.nn.functional.linear(hidden.float(), m.lm_head.weight.float())
    assert logits.dtype == torch.float32 and torch.equal(logits, want)
    engine.load(other)  # in place: the float32 copy of the head must follow
    with torch.no_grad():
        hidden = m.model(input_ids=ids).last_hidden_state
        want = torch.nn.functional.linear(hidden.float(), m.lm_head.weight.float())
        assert torch.equal(m(input_ids=ids).logits, want)
