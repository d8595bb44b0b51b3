"""LoRA (trainer/lora.py): the merged weights compute what the adapted model computes,
and a GRPO update trains the adapters alone (the swarm's adapter versions:
test_lora_versions.py)."""

from __future__ import annotations

import torch

from swarmrl.config.trainer import TrainerConfig, TrainerLoraConfig
from swarmrl.models.loading import load_model
from swarmrl.trainer import lora
from swarmrl.trainer.batch import Sample
from swarmrl.trainer.step import grpo_update


def _adapted(random_model_dir, seed=0):
    model = lora.wrap(load_model(str(random_model_dir)), TrainerLoraConfig(rank=4, alpha=8))
    torch.manual_seed(seed)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # B starts at zero (the adapted model is the base): move it
            p.data.normal_(0.0, 0.05)
    return model


def test_merged_weights_compute_what_the_adapted_model_does(random_model_dir):
    model = _adapted(random_model_dir)
    plain = load_model(str(random_model_dir))
    merged = lora.merged_state(model)
    assert merged.keys() == plain.state_dict().keys()
    changed = [k for k in merged if not torch.equal(merged[k], plain.state_dict()[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed), changed
    plain.load_state_dict(merged)
    ids = torch.randint(3, 40, (2, 12))
    with torch.no_grad():
        ours, theirs = model(input_ids=ids).logits, plain(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


def test_an_update_moves_the_adapters_and_nothing_else(random_model_dir):
    model = _adapted(random_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = lora.trainable(model)
    assert 0 < sum(p.numel() for p in params) < sum(p.numel() for p in model.parameters()) / 4
    opt = torch.optim.AdamW(params, lr=1e-2)
    samples = [
        Sample([5, 6, 7], [8, 9, 10, 2], adv, 0.0, 0.0, 0.0, 0, behav_logprobs=None)
        for adv in (1.0, -1.0, 0.5, -0.5)
    ]
    grpo_update(model, None, opt, samples, TrainerConfig(micro_batch=4), 16.0, 0)
    after = model.state_dict()
    moved = {k for k in after if not torch.equal(after[k], before[k])}
    assert moved and all(".lora_" in k for k in moved), sorted(moved)[:5]
