"""Where a process computes: the one place a device setting becomes a torch device.

Each process that runs a model has a setting: `trainer.device`,
`validator.device`, and for workers `swarmrl worker --device` (the launcher passes
`worker.device` to the workers it starts). Its values:

- `auto`: the process's CUDA device where torch sees one (under torchrun, the
  one of its LOCAL_RANK), else the CPU;
- `cuda`: the same CUDA device, and an error where there is none;
- `cuda:N`: that device, and an error if it does not exist;
- `cpu`.

Nothing falls back to the CPU silently: a CUDA setting on a machine without CUDA
is a ConfigError naming the setting, and each process logs what it resolved
(`describe`) and reports it (a worker in its hardware report, the trainer with
each step, a validator with each claim), which `swarmrl status` shows.

Every tensor of the trainer's step is made on the model's device: the same code
runs on the CPU and on a GPU. tests/unit/test_device.py runs the step with torch's
default device set to `meta`, so a tensor made without naming its device fails
there as it would meet the model on a GPU.
"""

from __future__ import annotations

import os
import re

from swarmrl.config.base import DEVICE_SETTING, ConfigError


def resolve_device(setting: str, what: str):
    """The torch device of `setting` (`what` names it in errors, e.g. 'trainer.device')."""
    import torch

    if not re.fullmatch(DEVICE_SETTING, setting):
        raise ConfigError(f"{what} = {setting!r}: expected auto, cpu, cuda or cuda:N")
    if setting == "cpu":
        return torch.device("cpu")
    have = torch.cuda.is_available()
    if setting == "auto" and not have:
        return torch.device("cpu")
    if not have:
        raise ConfigError(
            f"{what} = {setting!r} but torch sees no CUDA device (torch {torch.__version__}, "
            f"CUDA build: {torch.version.cuda or 'no'}); set it to 'cpu' or 'auto'"
        )
    index = int(setting.split(":")[1]) if ":" in setting else int(os.environ.get("LOCAL_RANK", 0))
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"{what} = {setting!r}: this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)


def describe(device) -> str:
    """The device in words for logs and status, e.g. 'cuda:0 (NVIDIA H100 80GB HBM3)'
    or 'cpu (2 threads)'."""
    import torch

    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device} ({torch.get_num_threads()} threads)"


def model_device(model):
    """The device a model's parameters are on (the first parameter's)."""
    return next(model.parameters()).device
