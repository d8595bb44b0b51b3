"""LoRA for the trainer (`[trainer.lora]`): low-rank adapters on the policy's linear
layers, through peft. The base weights stay frozen; each adapted layer computes
W0·x + (α/r)·B·A·x, and only A and B (with their AdamW states) are trained.

In the swarm, version 0 is the full base model and every later version is the
adapter alone, in peft's own format (`save_version`), signed with the base's
hashes in its manifest. Workers and validators run the merged model, W0 +
(α/r)·B·A for every adapted layer (shardcast/adapter.py; `merged_state` is the
same on the trainer's side): engines, TOPLOC proofs and every validator check
see ordinary weights of the base model's shape and names. The trainer computes
with the unmerged layers; the two differ by float rounding only, which the
importance weights and the mismatch figures see like any other numerics.
"""

from __future__ import annotations

from pathlib import Path

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


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapters' weights under peft's saved names (what `save_version` writes)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def save_version(model, d: Path, state: dict) -> None:
    """Write `state` into version directory `d`: the adapter (peft's files, which
    `PeftModel.from_pretrained` reads too) when it is `adapter_state`, else the whole
    model as HF files."""
    from safetensors.torch import save_file

    from swarmrl.shardcast.adapter import ADAPTER_FILE

    if not is_lora(model):
        model.save_pretrained(d, state_dict=state, safe_serialization=True)
    elif all(".lora_" in k for k in state):
        save_file(state, str(d / ADAPTER_FILE), metadata={"format": "pt"})
        model.peft_config["default"].save_pretrained(str(d))
    else:  # version 0: the base model
        model.get_base_model().save_pretrained(d, state_dict=state, safe_serialization=True)


def load_adapter(model, d: Path) -> None:
    """Set the adapters of `model` from the adapter version in `d` (a resume)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from swarmrl.shardcast.adapter import ADAPTER_FILE

    state = load_file(str(Path(d) / ADAPTER_FILE))
    result = set_peft_model_state_dict(model, state)
    if result.unexpected_keys:
        raise ValueError(f"{d}: adapter weights the model lacks: {result.unexpected_keys[:3]}")


def check_swarm(cfg) -> None:
    """Refuse what the swarm's trainer does not do with adapters: several ranks (FSDP),
    DiLoCo sites and a KL penalty (its reference model is the unwrapped base)."""
    from swarmrl.config import ConfigError

    tc = cfg.trainer
    if not tc.lora.rank:
        return
    if tc.ranks > 1 or tc.diloco.sites or tc.kl_coef > 0:
        raise ConfigError(
            "trainer.lora.rank > 0 works with one trainer rank, no DiLoCo sites and no KL "
            f"penalty; this run has ranks {tc.ranks}, diloco.sites {tc.diloco.sites}, "
            f"kl_coef {tc.kl_coef}"
        )
