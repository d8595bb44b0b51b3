"""The policy and batch of the FSDP2 test, the same in every process."""

from __future__ import annotations

import random

import torch

from swarmrl.config import TrainerConfig
from swarmrl.trainer.batch import Sample


def case(share: bool = True):
    from swarmrl.models.tiny import build_char_tokenizer, build_tiny_model

    torch.manual_seed(5)
    model = build_tiny_model(build_char_tokenizer(), hidden=64, layers=2, seed=5)
    rng = random.Random(5)
    samples = []
    for size, prompt_len in [(4, 6), (4, 9), (3, 5), (2, 7)]:  # 13 samples: shares differ
        prompt = [rng.randrange(3, 90) for _ in range(prompt_len)]
        for _ in range(size):
            comp = [rng.randrange(3, 90) for _ in range(rng.randint(1, 8))]
            samples.append(Sample(prompt, comp, rng.uniform(-1, 1), 0.0, 0.0, 0.0, 0))
    cfg = TrainerConfig(micro_batch=3, optimizer_steps=2, share_prompts=share)
    return model, samples, cfg, 80.0
