"""The generation engine seam: what workers and validators ask of an engine, and
the one place an engine and its device are chosen.

Two engines implement it: `HFBackend` (inference/hf.py, transformers with
swarmrl's own decoding loop) and `VLLMBackend` (inference/vllm.py, vLLM's
engine with swarmrl's sampler). A worker needs `Engine` (load, generate); a
validator needs `PrefillEngine`, which adds the prefill its checks replay
(final-norm states and logits of every generated position, one forward per
sample). Only the transformers engine has a prefill; `VLLMBackend` has none,
so `make_engine(..., prefill=True)` gives `HFBackend` whatever
`inference.backend` says: validators judge with transformers, workers may
generate with either.

Dtype: both engines run each version in the dtype its files hold, which the
trainer chose (`model.publish_dtype`); workers and validators need no setting.

Device: the caller resolves its process's setting (swarmrl/device.py: a
worker's `--device`, `validator.device`) and the transformers engine runs
there. vLLM runs where its build runs (CUDA: the first visible GPU; its CPU
build: the CPU); a device it cannot honour is a ConfigError, not a silent
move (pick a GPU for it with CUDA_VISIBLE_DEVICES).

`auto` takes vLLM only where it is installed and a CUDA GPU is present: on a
CPU its start-up and KV cache cost more than they give a worker of the local
swarm (choose it there with `vllm`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from swarmrl.config.base import ConfigError
from swarmrl.inference.generation import Completion

ENGINES = ("auto", "hf", "vllm")
VLLM_MISSING = (
    "inference.backend = 'vllm' but vLLM is not installed: `make vllm` installs it "
    "(see the README section 'vLLM backend')"
)


class Engine(Protocol):
    """A worker's engine: load a policy version (or swap it in), then sample."""

    def load(self, path: Path) -> None: ...

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        proofs: bool = True,
    ) -> list[Completion]: ...


class PrefillEngine(Engine, Protocol):
    """A validator's engine: also replays finished samples in one forward each."""

    def prefill_batches(
        self, prompts: list[list[int]], completions: list[list[int]], max_tokens: int = ...
    ) -> Iterator[list[tuple]]:
        """Per batch: (index, final-norm states (n, H), logits (n, V)) of each sample's
        n generated positions."""


def resolve_engine(name: str) -> str:
    """'hf' or 'vllm' for a configured name ('auto', 'hf' or 'vllm')."""
    if name not in ENGINES:
        raise ValueError(f"unknown inference backend {name!r} (auto, hf or vllm)")
    if name != "auto":
        return name
    import torch

    from swarmrl.inference.vllm import vllm_available

    return "vllm" if torch.cuda.is_available() and vllm_available() else "hf"


def make_engine(
    cfg, device, threads: int = 1, name: str | None = None, prefill: bool = False
):  # fmt: skip
    """The engine of a worker (`name` overrides `inference.backend`) or, with
    `prefill`, of a validator, on `device` (a torch device): the one place an engine
    is chosen."""
    inf = cfg.inference
    which = "hf" if prefill else resolve_engine(name or inf.backend)
    if which == "vllm" and cfg.env.kind != "none" and (name or inf.backend) == "auto":
        # 'auto' keeps multi-turn runs on transformers: vLLM's proofs of environment
        # positions cost one request per token (bench/vllm_trajectories.py); name it to use it
        which = "hf"
    if which == "hf":
        from swarmrl.inference.hf import HFBackend

        return HFBackend(device=str(device), max_batch=inf.max_batch)  # the versions' dtype
    from swarmrl.inference.vllm import VLLMBackend, vllm_available

    if not vllm_available():
        raise ConfigError(VLLM_MISSING)  # the CLI prints it and exits 2
    _check_vllm_device(device)
    return VLLMBackend(
        max_batch=inf.max_batch, kv_cache_gb=inf.kv_cache_gb,
        threads=threads, gpu_memory=inf.gpu_memory,
    )  # fmt: skip


def _check_vllm_device(device) -> None:
    """vLLM runs where its build does: a CUDA build on the first visible GPU, the CPU
    build on the CPU."""
    import torch

    if torch.cuda.is_available() and device.type == "cpu":
        raise ConfigError(
            "the worker's device is the CPU but vLLM is a CUDA build here: "
            "use --backend hf for a CPU worker"
        )
    if device.type == "cuda" and (device.index or 0) != 0:
        raise ConfigError(
            f"vLLM runs on the first visible GPU, not {device}: "
            f"start the worker with CUDA_VISIBLE_DEVICES={device.index} and --device cuda"
        )
