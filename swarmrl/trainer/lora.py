"""LoRA for the trainer (`[trainer.lora]`): low-rank adapters on the policy's linear
layers, through peft. The base weights stay frozen; each adapted layer computes
W0·x + (α/r)·B·A·x, and only A and B (with their AdamW states) are trained.

What the rest of the swarm runs is the merged model, W0 + (α/r)·B·A for every
adapted layer (`merged_state`): engines, TOPLOC proofs and every validator check
see ordinary weights of the base model's shape and names. The trainer computes
with the unmerged layers; the two differ by float rounding only, which the
importance weights and the mismatch figures see like any other numerics.
"""

from __future__ import annotations

import torch


def wrap(model, lc):
    """`model` with LoRA adapters of `lc` (a TrainerLoraConfig) on its linear layers;
    only the adapters require gradients."""
    from peft import LoraConfig, get_peft_model

    targets = "all-linear" if lc.target_modules == ["all-linear"] else list(lc.target_modules)
    config = LoraConfig(
        r=lc.rank, lora_alpha=lc.alpha, lora_dropout=0.0, bias="none",
        target_modules=targets, init_lora_weights=True,
    )  # fmt: skip
    return get_peft_model(model, config)


def is_lora(model) -> bool:
    return hasattr(model, "peft_config")


def merged_state(model) -> dict[str, torch.Tensor]:
    """The weights the adapted model computes with, under the base model's own names:
    each adapted layer's W0 + (α/r)·B·A, every other tensor as it is."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            (adapter,) = module.active_adapters
            deltas[f"{name}.weight"] = module.get_delta_weight(adapter)
    out = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = (value + deltas[key].to(value.dtype)) if key in deltas else value
    return out


def trainable(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def refuse_in_swarm(cfg) -> None:
    """Not finished: the swarm's trainer does not train adapters yet, nor publish
    adapter-only versions for workers to merge (issue 37). A run that asks for them
    is refused, not trained in full without saying so; bench/loss_table.py measures
    LoRA's learning in one process."""
    from swarmrl.config import ConfigError

    if cfg.trainer.lora.rank:
        raise ConfigError(
            "trainer.lora.rank > 0: the swarm cannot train LoRA adapters yet (only "
            "bench/loss_table.py does); set trainer.lora.rank = 0"
        )
